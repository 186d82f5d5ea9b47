"""Does a TMA data path lift the one-token tile's read ceiling? (GPU probe)

    python3 benchmarks/tma_access_probe.py --out results.json [--commit SHA]

A question, not a kernel (like bench_access.py). The one-token gate/up
launch (kernels/moe_block_matmul.py, BM 1) reads, per program and per
128-wide group, one contiguous run of 64 rows x CB bytes per field and per
64-row tile (docs/WEIGHT_LAYOUT.md v2+), plus the tile's (scale, offset)
words, streamed through shared memory by cp.async (Triton's pipelined
`tl.load`). At 2 bits the decoded kernel sits at 43 % of the copy bandwidth
and session 7 measured the same reads without any decode at ~71 %: the
per-step data path, not the decode, bounds the 2-bit view.

This probe reads exactly the bytes of a Mixtral B=1 gate/up launch (four
blocks 14336 x 4096; the fields of the 2-, 4- and 8-bit views and their
scales; 448 programs of 128 rows on 4 warps) in the same tile-major order,
and consumes each word with one integer add so that no load is dead, in
two ways:

  cp.async: `tl.load` of pointer tiles [128, CB / 4] (what the kernels do);
  tma x1:   `desc.load` of 64-row boxes (one group's run) through host
            tensor descriptors over each field's byte string (Hopper's bulk
            tensor copies, completed on an mbarrier; one thread issues a
            box, no per-thread copies);
  tma x4:   boxes of four consecutive groups' runs (256 rows), a quarter
            of the copies and barriers per byte.

Both loops are `tl.range(num_stages=S)`. Output: us per launch and % of the
copy bandwidth per (view, path, stages), L2 defeated by rotating weight
copies inside each graph replay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_access import BLOCKS, GROUP, K, N, rotated_copies  # noqa: E402  (Mixtral B=1 gate/up)
from benchmarks.graph_timing import bench_graph, copy_bandwidth  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402

TILE = 64  # rows of a tile-major run
BN = 128  # rows of a program (two tiles)
# Words per (row, group) of each field (2-, 1-, 1-, 2-, 2-bit fields) and of
# the (scale, offset) pair.
FIELD_WORDS = (8, 4, 4, 8, 8)
SCALE_WORDS = 1
BLOCKS_C = tl.constexpr(BLOCKS)
VIEW_FIELDS = {2: 1, 4: 3, 8: 5}
GROUPS_PER_BOX = (1, 4)  # TMA boxes of one group's run, or of four consecutive runs
PATHS = ("cp.async", *(f"tma x{gpl}" for gpl in GROUPS_PER_BOX))


@triton.jit
def _first_run(copy, blk, tile64, G, TILES64):
    # Index of run (copy, blk, tile64, group 0) among a field's runs; a
    # tile's groups are consecutive runs of TILE rows.
    return ((copy * BLOCKS_C + blk) * TILES64 + tile64) * G


@triton.jit
def _read_ptr_kernel(f0, f1, f2, f3, f4, sc, out_ptr, G, copy, TILES64,
                     NF: tl.constexpr, STAGES: tl.constexpr):
    tile128 = tl.program_id(0) % (TILES64 // 2)
    blk = tl.program_id(0) // (TILES64 // 2)
    r = tl.arange(0, 128)
    t64 = 2 * tile128 + r // 64  # [128] each row's 64-row tile
    acc = tl.zeros((128,), tl.int32)
    for g in tl.range(0, G, num_stages=STAGES):
        row = (_first_run(copy, blk, t64, G, TILES64) + g) * 64 + r % 64  # [128] rows in the [runs * 64, w] views
        acc += tl.load(sc + row)
        acc += tl.sum(tl.load(f0 + row[:, None] * 8 + tl.arange(0, 8)[None, :]), axis=1)
        if NF >= 3:
            acc += tl.sum(tl.load(f1 + row[:, None] * 4 + tl.arange(0, 4)[None, :]), axis=1)
            acc += tl.sum(tl.load(f2 + row[:, None] * 4 + tl.arange(0, 4)[None, :]), axis=1)
        if NF >= 5:
            acc += tl.sum(tl.load(f3 + row[:, None] * 8 + tl.arange(0, 8)[None, :]), axis=1)
            acc += tl.sum(tl.load(f4 + row[:, None] * 8 + tl.arange(0, 8)[None, :]), axis=1)
    tl.store(out_ptr + tl.program_id(0) * 128 + r, acc)


@triton.jit
def _tma_pair(desc, row_a, row_b, GPL: tl.constexpr):
    # int32 [128]: one box of GPL consecutive groups (GPL * 64 rows) of each
    # of the program's two tiles, summed per row.
    a = tl.sum(tl.reshape(tl.sum(desc.load([row_a, 0]), axis=1), (GPL, 64)), axis=0)
    b = tl.sum(tl.reshape(tl.sum(desc.load([row_b, 0]), axis=1), (GPL, 64)), axis=0)
    return tl.reshape(tl.permute(tl.join(a, b), (1, 0)), (128,))


@triton.jit
def _read_tma_kernel(d0, d1, d2, d3, d4, dsc, out_ptr, G, copy, TILES64,
                     NF: tl.constexpr, STAGES: tl.constexpr, GPL: tl.constexpr):
    # GPL: groups per box (a tile's runs of consecutive groups are adjacent).
    tile128 = tl.program_id(0) % (TILES64 // 2)
    blk = tl.program_id(0) // (TILES64 // 2)
    r = tl.arange(0, 128)
    acc = tl.zeros((128,), tl.int32)
    base_a = _first_run(copy, blk, 2 * tile128, G, TILES64)
    base_b = base_a + G
    for g in tl.range(0, G, GPL, num_stages=STAGES):
        ra = (base_a + g) * 64
        rb = (base_b + g) * 64
        # scales: [runs, 64] words, one box row per run
        sa = tl.sum(dsc.load([base_a + g, 0]), axis=0)  # [64]
        sb = tl.sum(dsc.load([base_b + g, 0]), axis=0)
        acc += tl.reshape(tl.permute(tl.join(sa, sb), (1, 0)), (128,))
        acc += _tma_pair(d0, ra, rb, GPL)
        if NF >= 3:
            acc += _tma_pair(d1, ra, rb, GPL)
            acc += _tma_pair(d2, ra, rb, GPL)
        if NF >= 5:
            acc += _tma_pair(d3, ra, rb, GPL)
            acc += _tma_pair(d4, ra, rb, GPL)
    tl.store(out_ptr + tl.program_id(0) * 128 + r, acc)


def make_fields(copies: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    runs = copies * BLOCKS * (N // TILE) * (K // GROUP)
    fields = [torch.randint(-2**20, 2**20, (runs * TILE * w,), device="cuda", dtype=torch.int32)
              for w in FIELD_WORDS]
    scales = torch.randint(-2**20, 2**20, (runs * TILE * SCALE_WORDS,), device="cuda", dtype=torch.int32)
    return fields, scales


def reference(fields, scales, nf: int, copy: int) -> torch.Tensor:
    """int32 [programs * 128]: each row's sum of its words over all groups."""
    g = K // GROUP
    per_copy = BLOCKS * (N // TILE) * g * TILE
    total = scales[copy * per_copy:(copy + 1) * per_copy].view(BLOCKS, N // TILE, g, TILE).sum(2, dtype=torch.int64)
    for f, w in zip(fields[:nf], FIELD_WORDS):
        part = f[copy * per_copy * w:(copy + 1) * per_copy * w].view(BLOCKS, N // TILE, g, TILE, w)
        total += part.sum((2, 4), dtype=torch.int64)
    return total.to(torch.int32).reshape(-1)  # wraps like the kernel's int32 adds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit")
    ap.add_argument("--stages", default="2,3,4,6")
    ap.add_argument("--bits", default="2,4,8")
    args = ap.parse_args()
    started = time.time()
    hbm = copy_bandwidth()
    copies = rotated_copies()
    fields, scales = make_fields(copies)
    g = K // GROUP
    runs = copies * BLOCKS * (N // TILE) * g
    descs = {gpl: [TensorDescriptor(f, [runs * TILE, w], [w, 1], [gpl * TILE, w]) for f, w in zip(fields, FIELD_WORDS)]
             for gpl in GROUPS_PER_BOX}
    dscs = {gpl: TensorDescriptor(scales, [runs, TILE], [TILE, 1], [gpl, TILE]) for gpl in GROUPS_PER_BOX}
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    programs = BLOCKS * N // BN
    out = torch.empty(programs * 128, dtype=torch.int32, device="cuda")
    rows = []
    for bits in [int(b) for b in args.bits.split(",")]:
        nf = VIEW_FIELDS[bits]
        nbytes = BLOCKS * N * g * 4 * (SCALE_WORDS + sum(FIELD_WORDS[:nf]))
        ref = reference(fields, scales, nf, 1)
        for stages in [int(s) for s in args.stages.split(",")]:
            for path in PATHS:
                def launch(i=0, path=path, stages=stages):
                    if path != "cp.async":
                        gpl = GROUPS_PER_BOX[PATHS.index(path) - 1]
                        _read_tma_kernel[(programs,)](*descs[gpl], dscs[gpl], out, g, i % copies, N // TILE,
                                                      NF=nf, STAGES=stages, GPL=gpl, num_warps=4)
                    else:
                        _read_ptr_kernel[(programs,)](*fields, scales, out, g, i % copies, N // TILE,
                                                      NF=nf, STAGES=stages, num_warps=4)
                try:
                    launch(1)
                except triton.runtime.errors.OutOfResources as e:  # x4 boxes at many stages
                    rows.append(dict(bits=bits, path=path, stages=stages, error=str(e)))
                    print(f"bits={bits} st={stages} {path:8s} {e}", flush=True)
                    continue
                torch.cuda.synchronize()
                out.zero_()
                launch(1)
                torch.cuda.synchronize()
                ok = bool(torch.equal(out, ref))
                ms = bench_graph(launch, copies)
                gbps = nbytes / ms / 1e6
                rows.append(dict(bits=bits, path=path, stages=stages, time_us=ms * 1e3, bytes=nbytes, GBps=gbps,
                                 pct_copy=100 * gbps / hbm, matches_reference=ok))
                print(f"bits={bits} st={stages} {path:8s} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s "
                      f"{100 * gbps / hbm:5.1f}% ok={ok}", flush=True)
    result = {
        "benchmark": "one-token gate/up reads without decode: cp.async pointer loads vs TMA descriptor loads "
                     "(Mixtral B=1 bytes, 448 programs of 128 rows, 4 warps)",
        "command": " ".join(["benchmarks/tma_access_probe.py", *sys.argv[1:]]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(args.commit),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "triton": triton.__version__,
        "copy_GBps": hbm, "copies_rotated": copies, "rows": rows, "wall_s": time.time() - started,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'bits':>4s} {'st':>3s} " + " ".join(f"{p + ' %':>11s}" for p in PATHS))
    for bits in sorted({r["bits"] for r in rows}):
        for st in sorted({r["stages"] for r in rows}):
            sel = {r["path"]: r.get("pct_copy", float("nan")) for r in rows if r["bits"] == bits and r["stages"] == st}
            print(f"{bits:4d} {st:3d} " + " ".join(f"{sel[p]:11.1f}" for p in PATHS))


if __name__ == "__main__":
    main()
