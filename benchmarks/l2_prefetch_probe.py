"""Probe (GPU): does warming the L2 with the next dense projection's weights,
while the MoE layer runs, shorten that projection?

At B=1 a decode step is a chain of launches; the cuBLAS projections (qkv 50 MB,
o 33 MB for Mixtral) run at ~60-68 % of the copy bandwidth, and session 6
found the loss in each short kernel's ramp, whatever the kernel. The MoE
launches before them are latency-bound at ~50 % of HBM, so HBM has room while
they run. Question: if a side stream reads the first X MB of the next
projection's weight into the L2 during the MoE layer, how much faster is the
projection, and what does the MoE layer lose?

One CUDA graph per variant replays R rotations of [MoE layer (Mixtral 4-bit,
B=1, the fused kernels) ; x @ Wqkv_r.T], each with its own copy of Wqkv (the
MoE layer streams ~190 MB, which also evicts the L2 between rotations).
Variants: no prefetch; the first X MB of Wqkv_r fetched on a side stream
forked before the MoE layer and joined before the projection, either by
evict_last loads of a few programs or by cp.async.bulk.prefetch.L2 (the TMA
unit fetches, the issuing programs end at once). Reported: us per rotation (median of do_bench), and the
projection alone (cold) and the MoE layer alone.

    python3 benchmarks/l2_prefetch_probe.py --out benchmarks/results/l2_prefetch_probe_h200.json --commit C
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_setup import MIXTRAL, build_store, fields_config, routing  # noqa: E402
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed  # noqa: E402
from kernels.moe_tile_choice import choose_tiles  # noqa: E402

ROTATIONS = 4
PAGE_BYTES = 2 * 2**20
QKV_ROWS = 6144  # Mixtral q (4096) + k (1024) + v (1024) rows, hidden 4096


@triton.jit
def _warm_l2_kernel(src_ptr, n_words, sink_ptr, BLOCK: tl.constexpr):
    # Reads words [0, n_words) of src with evict_last (kept in the L2 ahead of
    # streamed lines); the xor into sink keeps the loads alive.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(pid * BLOCK, n_words, step):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    tl.store(sink_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)


@triton.jit
def _bulk_prefetch_kernel(src_ptr, n_chunks, BLOCK: tl.constexpr):
    # One cp.async.bulk.prefetch.L2 of BULK_CHUNK bytes per thread: the TMA
    # unit fetches them; the program issues and ends (no registers held).
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    addr = (src_ptr + tl.minimum(c, n_chunks - 1).to(tl.int64) * 16384).to(tl.int64)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 16384; mov.u32 $0, 0;", "=r,l", [addr],
                              dtype=tl.int32, is_pure=False, pack=1)


BULK_CHUNK = 16384
BULK_BLOCK = 128


def bulk_prefetch(w: torch.Tensor, nbytes: int) -> None:
    src = w.view(torch.uint8).reshape(-1)
    n_chunks = min(src.numel(), nbytes) // BULK_CHUNK
    _bulk_prefetch_kernel[(triton.cdiv(n_chunks, BULK_BLOCK),)](src, n_chunks, BLOCK=BULK_BLOCK, num_warps=4)


def warm_l2(w: torch.Tensor, nbytes: int, sink: torch.Tensor, programs: int, block: int) -> None:
    words = w.view(torch.int32).reshape(-1)
    n = min(words.numel(), nbytes // 4)
    _warm_l2_kernel[(programs,)](words, n, sink, BLOCK=block, num_warps=2)


def median_us(graph: torch.cuda.CUDAGraph) -> float:
    return triton.testing.do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e3 / ROTATIONS


def capture(fn) -> torch.cuda.CUDAGraph:
    for i in range(ROTATIONS):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(ROTATIONS):
            fn(i)
    return graph


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--mb", default="0,8,16,24,32,50")
    ap.add_argument("--programs", default="0,32,128", help="0: bulk prefetch; else evict_last load programs")
    args = ap.parse_args()
    dev = "cuda"
    shape = MIXTRAL
    weights = build_store(shape, 1, PAGE_BYTES, dev)
    weights.block_fields.copy_(fields_config(shape, 1, "4"))
    ids, tw = routing(shape, 1, dev)
    x = torch.randn(1, shape.hidden, device=dev, dtype=torch.bfloat16)
    tiles = choose_tiles(1, shape.top_k, shape.experts, shape.hidden, shape.ffn,
                         torch.cuda.get_device_properties(0).multi_processor_count, use_asm=True)
    ws = alloc_workspace(1, shape.top_k, shape.hidden, shape.ffn, shape.experts, tiles, dev)
    wqkv = [torch.randn(QKV_ROWS, shape.hidden, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(ROTATIONS)]
    out = torch.empty(1, QKV_ROWS, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    block = 2048
    sink = torch.empty(max(1, *(int(p) for p in args.programs.split(","))) * block, dtype=torch.int32, device=dev)

    def moe(i: int) -> None:
        fused_moe_mixed(x, ids, tw, weights, 0, shape.experts, shape.ffn, tiles, ws)

    def qkv(i: int) -> None:
        torch.matmul(x, wqkv[i].T, out=out)

    def step(mb: int, programs: int):
        # programs 0: the bulk (TMA) prefetch; else evict_last loads by that many programs
        def fn(i: int) -> None:
            if mb:
                main_stream = torch.cuda.current_stream()
                side.wait_stream(main_stream)
                moe(i)
                with torch.cuda.stream(side):
                    if programs:
                        warm_l2(wqkv[i], mb * 2**20, sink, programs, block)
                    else:
                        bulk_prefetch(wqkv[i], mb * 2**20)
                main_stream.wait_stream(side)
            else:
                moe(i)
            qkv(i)
        return fn

    rows = [dict(case="moe layer alone", us=median_us(capture(moe))),
            dict(case="qkv alone (rotated, L2 cold-ish)", us=median_us(capture(qkv)))]
    for programs in (int(p) for p in args.programs.split(",")):
        for mb in (int(m) for m in args.mb.split(",")):
            if mb == 0 and programs != int(args.programs.split(",")[0]):
                continue
            rows.append(dict(case="moe ; qkv", prefetch_mb=mb, programs=programs,
                             us=median_us(capture(step(mb, programs)))))
    for r in rows:
        print(f"{r['case']:36s} {r.get('prefetch_mb', ''):>4} {r.get('programs', ''):>4} {r['us']:8.2f} us")
    result = dict(gpu=torch.cuda.get_device_name(0),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  command=" ".join(["python3", "benchmarks/l2_prefetch_probe.py", *sys.argv[1:]]),
                  commit=args.commit, torch=torch.__version__, triton=triton.__version__,
                  rotations=ROTATIONS, rows=rows)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
