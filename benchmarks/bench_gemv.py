"""The decode GEMV (kernels/dense_gemv.py) against cuBLAS at the Mixtral-8x7B
attention projections, 1-4 tokens, over a few launch shapes. One command
(GPU), writes JSON and prints a short table last:

    python benchmarks/bench_gemv.py --commit <sha> --out benchmarks/results/gemv_h200.json

Each time is one launch's share of a CUDA graph of back-to-back launches
that cycle over enough copies of W (256 MB in all) that every launch reads
W from HBM, as a decode step does; PDL off (kernels/pdl.py), so this is the
kernel alone and not the overlap e2e_decode.py measures in the step.
triton.testing.do_bench's L2 flush was tried first and gave the GEMV two to
three times its in-step time (e2e_decode.py --profile-batches), so it is not
used. GB/s counts W's bytes once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.dense_gemv import (GEMV_MAX_TOKENS, NUM_WARPS, GemvTiles, dense_gemv,  # noqa: E402
                                dense_gemv_reference)
from kernels.pdl import PdlPolicy  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096)}  # (N, K) at Mixtral-8x7B
BLOCK_N = (4, 8, 16)
BLOCK_K = (128, 256, 512)
ROTATION_BYTES = 256 << 20  # W copies cycled through: several times the H200's 50 MB L2
ROUNDS = 4  # passes over the copies per graph
REPLAYS = 20
# Sweep points whose fp32 accumulator ([T, block_n, block_k]) would exceed
# this many registers a thread are skipped (they spill).
MAX_ACC_PER_THREAD = 64

NO_PDL = PdlPolicy(max_rows=0)  # the kernel alone, no launch overlapping the previous one


def graph_us(launch, copies: int) -> float:
    """Median over replays of one launch's share of a graph of ROUNDS x
    copies launches; launch(i) runs the product on copy i."""
    launch(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(ROUNDS * copies):
            launch(i % copies)
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (ROUNDS * copies))
    return sorted(times)[len(times) // 2]


@dataclass
class Projection:
    """One projection's operands for timing: copies of W [N, K] past the L2,
    x [T, K], an out buffer, the fp32 reference on the first copy, and
    cuBLAS's time for it (bf16)."""

    w_bytes: int
    copies: int
    ws: list
    x: torch.Tensor
    out: torch.Tensor
    want: torch.Tensor
    cublas_us: float


def projection(n: int, k: int, tokens: int) -> Projection:
    """Random operands for an [N, K] projection of `tokens` rows, cuBLAS timed."""
    w_bytes = n * k * 2
    copies = max(2, -(-ROTATION_BYTES // w_bytes))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    cublas_us = graph_us(lambda i: torch.matmul(x, ws[i].T, out=out), copies)
    return Projection(w_bytes, copies, ws, x, out, dense_gemv_reference(x, ws[0]), cublas_us)


def measure(n: int, k: int, tokens: int, block_n=BLOCK_N, block_k=BLOCK_K, warps=(NUM_WARPS,)) -> dict:
    p = projection(n, k, tokens)
    w_bytes, copies, ws, x, out, want, cublas_us = p.w_bytes, p.copies, p.ws, p.x, p.out, p.want, p.cublas_us
    tiles = {}
    for bn, bk, nw in itertools.product(block_n, block_k, warps):
        if bk > k or tokens * bn * bk // (nw * 32) > MAX_ACC_PER_THREAD:
            continue
        t = GemvTiles(block_n=bn, block_k=bk, num_warps=nw)
        got = dense_gemv(x, ws[0], t, pdl=NO_PDL)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        if err > 1e-2:
            raise RuntimeError(f"GEMV {t} off by {err} at {n}x{k}, {tokens} tokens")
        key = f"{bn}x{bk}" + (f"w{nw}" if nw != NUM_WARPS else "")
        tiles[key] = graph_us(lambda i, t=t: dense_gemv(x, ws[i], t, out=out, pdl=NO_PDL), copies)
    best = min(tiles, key=tiles.get)
    default = GemvTiles()
    default_key = f"{default.block_n}x{default.block_k}"
    return {"n": n, "k": k, "tokens": tokens, "w_bytes": w_bytes, "copies": copies, "cublas_us": cublas_us,
            "gemv_us": tiles, "default_us": tiles.get(default_key, float("nan")),
            "best": best, "best_us": tiles[best], "best_GBps": w_bytes / tiles[best] / 1e3,
            "cublas_GBps": w_bytes / cublas_us / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default=",".join(str(t) for t in range(1, GEMV_MAX_TOKENS + 1)),
                    help="token counts, comma-separated")
    ap.add_argument("--block-n", default=",".join(map(str, BLOCK_N)), help="rows per program to sweep")
    ap.add_argument("--block-k", default=",".join(map(str, BLOCK_K)), help="K chunks to sweep (<= K)")
    ap.add_argument("--num-warps", default=str(NUM_WARPS), help="warps per program to sweep")
    args = ap.parse_args()

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(v) for v in text.split(",") if v)

    rows = [dict(measure(n, k, t, ints(args.block_n), ints(args.block_k), ints(args.num_warps)), shape=name)
            for name, (n, k) in SHAPES.items() for t in ints(args.tokens)]
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "commit": args.commit,
                                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__,
                                    "method": "graph of back-to-back launches over rotated W copies, PDL off",
                                    "rows": rows}, indent=1))
    print("shape  T  cuBLAS us  GEMV default us  best tiles  best us  best GB/s")
    for r in rows:
        print(f"{r['shape']:5s} {r['tokens']:2d} {r['cublas_us']:9.1f} {r['default_us']:16.1f} "
              f"{r['best']:>10s} {r['best_us']:8.1f} {r['best_GBps']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
