"""How fast can the MoE weight launches read their bytes, decode aside? (GPU)

    python3 benchmarks/bench_access.py --out results.json [--commit SHA]

A question, not a kernel: the gate/up launch reads, per program and per
128-wide group, a 32-byte chunk (2-bit field) or 16-byte chunk (1-bit field)
of each of its 128 rows, rows being 1 KiB (2-bit) / 512 B (1-bit) apart in a
field's row-major byte string (docs/WEIGHT_LAYOUT.md v1). This benchmark reads
exactly the bytes of a Mixtral gate/up launch at B=1 (two experts, four
blocks, 14336 x 4096, fields of the 2-, 4- and 8-bit views) with the same
program grid, pipelining and tensor-core products, but without any decode:
the chunks are taken as fp16 values as they are. Two orders of the same
bytes:
* rows: v1, a row's chunks are consecutive, rows follow each other;
* tiles: the chunks of one (128-row tile, group) are consecutive, so a
  program's step reads one contiguous run (4 KiB for a 2-bit field).
If "rows" already reads far below the copy bandwidth, the access pattern
(not the decode) caps the kernels; if "tiles" is much faster, a layout
version with tile-major fields is worth its contract change.

(The run in results/access_h200.json, 91de6f9, timed with its own graph loop
at 20 warm-up / 200 timed replays; the script now shares bench_moe's timing.)
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.graph_timing import bench_graph, copy_bandwidth  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402

N, K, GROUP = 14336, 4096, 128
BLOCKS = 4  # gate and up of two experts: Mixtral B=1
# Bytes per (row, group) of each field: widths (2, 1, 1, 2, 2) bits x 128.
CHUNK_BYTES = (32, 16, 16, 32, 32)
VIEW_FIELDS = {2: 1, 4: 3, 8: 5}
L2_BYTES = 60 * 2**20


@triton.jit
def _chunk_ptrs(base, blk, n, g, G, BN: tl.constexpr, CH: tl.constexpr, TILES: tl.constexpr, N):
    # fp16 pointers [BN, CH] to the chunks of rows n, group g of block blk.
    blk_base = base + blk.to(tl.int64) * N * G * CH
    j = tl.arange(0, CH)[None, :]
    if TILES:
        tile = n // BN
        off = (tile.to(tl.int64) * G + g) * (BN * CH) + (n % BN) * CH
    else:
        off = n.to(tl.int64) * (G * CH) + g * CH
    return blk_base + off[:, None] + j


@triton.jit
def _read_kernel(f0, f1, f2, f3, f4, x_ptr, out_ptr, N, G, copy,
                 NF: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, TILES: tl.constexpr):
    tiles = N // BN
    blk = copy * 4 + tl.program_id(0) // tiles
    n = (tl.program_id(0) % tiles) * BN + tl.arange(0, BN)
    k16 = tl.arange(0, 16)
    acc = tl.zeros((BN, BM), tl.float32)
    for g in range(G):
        xg = tl.load(x_ptr + (g * 16 + k16)[:, None] * BM + tl.arange(0, BM)[None, :])  # [16, BM]
        w = tl.load(_chunk_ptrs(f0, blk, n, g, G, BN, 16, TILES, N))
        acc = tl.dot(w, xg, acc)
        if NF >= 3:
            a = tl.load(_chunk_ptrs(f1, blk, n, g, G, BN, 8, TILES, N))
            b = tl.load(_chunk_ptrs(f2, blk, n, g, G, BN, 8, TILES, N))
            acc = tl.dot(tl.reshape(tl.join(a, b), (BN, 16)), xg, acc)
        if NF >= 5:
            acc = tl.dot(tl.load(_chunk_ptrs(f3, blk, n, g, G, BN, 16, TILES, N)), xg, acc)
            acc = tl.dot(tl.load(_chunk_ptrs(f4, blk, n, g, G, BN, 16, TILES, N)), xg, acc)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.sum(acc, axis=1), axis=0))


def rotated_copies() -> int:
    """Weight copies to rotate through so that each launch reads from HBM:
    at least 4 L2s of the 2-bit field's bytes (the smallest view), and 2."""
    return max(2, -(-4 * L2_BYTES // (BLOCKS * N * K // 4)))


def run(bits: int, tiles: bool, copies: int, fields: list[torch.Tensor], x: torch.Tensor, bn: int,
        stages: int) -> float:
    """ms of one launch over a different weight copy each time (graph replays)."""
    nf = VIEW_FIELDS[bits]
    grid = (BLOCKS * (N // bn),)
    out = torch.empty(grid[0], device="cuda")
    g = K // GROUP

    def launch(i=0):
        _read_kernel[grid](*fields, x, out, N, g, i % copies, NF=nf, BN=bn, BM=16, TILES=tiles,
                           num_warps=4, num_stages=stages)

    return bench_graph(launch, copies)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit")
    ap.add_argument("--block-n", default="128,64")
    ap.add_argument("--stages", default="3")
    args = ap.parse_args()
    started = time.time()
    hbm = copy_bandwidth()
    per_copy = BLOCKS * N * (K // GROUP) * sum(CHUNK_BYTES)  # all five fields
    copies = rotated_copies()
    fields = [torch.randn(copies * BLOCKS * N * (K // GROUP) * cb // 2, device="cuda", dtype=torch.float16)
              for cb in CHUNK_BYTES]
    x = torch.randn(K // GROUP * 16, 16, device="cuda", dtype=torch.float16) * 1e-3
    rows = []
    for bn in [int(b) for b in args.block_n.split(",")]:
        for stages in [int(s) for s in args.stages.split(",")]:
            for bits in (2, 4, 8):
                for tiles in (False, True):
                    ms = run(bits, tiles, copies, fields, x, bn, stages)
                    nbytes = BLOCKS * N * (K // GROUP) * sum(CHUNK_BYTES[:VIEW_FIELDS[bits]])
                    gbps = nbytes / ms / 1e6
                    rows.append(dict(bits=bits, order="tiles" if tiles else "rows", block_n=bn, stages=stages,
                                     time_us=ms * 1e3, bytes=nbytes, GBps=gbps, pct_copy=100 * gbps / hbm))
                    print(f"bn={bn:3d} st={stages} bits={bits} {rows[-1]['order']:5s} {ms * 1e3:8.1f} us "
                          f"{gbps:7.0f} GB/s {100 * gbps / hbm:5.1f}%", flush=True)
    result = {
        "benchmark": "MoE gate/up read pattern without decode (Mixtral B=1 bytes, grid and pipeline)",
        "command": " ".join(["benchmarks/bench_access.py", *sys.argv[1:]]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(args.commit),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "triton": triton.__version__,
        "copy_GBps": hbm, "copies_rotated": copies, "bytes_per_copy_all_fields": per_copy,
        "rows": rows, "wall_s": time.time() - started,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'bn':>4s} {'bits':>4s} {'rows %':>7s} {'tiles %':>8s}")
    for bn in sorted({r['block_n'] for r in rows}):
        for bits in (2, 4, 8):
            sel = {r["order"]: r["pct_copy"] for r in rows if r["block_n"] == bn and r["bits"] == bits
                   and r["stages"] == int(args.stages.split(",")[0])}
            print(f"{bn:4d} {bits:4d} {sel['rows']:7.1f} {sel['tiles']:8.1f}")


if __name__ == "__main__":
    main()
