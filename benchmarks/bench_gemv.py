"""The decode GEMV (kernels/dense_gemv.py) against cuBLAS at the Mixtral-8x7B
attention projections, 1-4 tokens, over a few launch shapes. One command
(GPU), writes JSON and prints a short table last:

    python benchmarks/bench_gemv.py --commit <sha> --out benchmarks/results/gemv_h200.json

Times are medians of triton.testing.do_bench (the L2 flushed before every
repetition, so W comes from HBM as in a decode step); GB/s counts W's bytes
once. This is the kernel alone; e2e_decode.py measures it in the step, where
PDL lets it start under the previous launch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.dense_gemv import GEMV_MAX_TOKENS, GemvTiles, dense_gemv, dense_gemv_reference  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096)}  # (N, K) at Mixtral-8x7B
BLOCK_N = (4, 8, 16)
BLOCK_K = (128, 256, 512)


def measure(n: int, k: int, tokens: int) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    want = dense_gemv_reference(x, w)
    w_bytes = w.numel() * w.element_size()
    cublas_us = do_bench(lambda: F.linear(x, w), return_mode="median") * 1e3
    tiles = {}
    for bn, bk in itertools.product(BLOCK_N, BLOCK_K):
        t = GemvTiles(block_n=bn, block_k=bk)
        got = dense_gemv(x, w, t)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        if err > 1e-2:
            raise RuntimeError(f"GEMV {t} off by {err} at {n}x{k}, {tokens} tokens")
        tiles[f"{bn}x{bk}"] = do_bench(lambda: dense_gemv(x, w, t), return_mode="median") * 1e3
    best = min(tiles, key=tiles.get)
    return {"n": n, "k": k, "tokens": tokens, "w_bytes": w_bytes, "cublas_us": cublas_us,
            "gemv_us": tiles, "default_us": tiles[f"{GemvTiles().block_n}x{GemvTiles().block_k}"],
            "best": best, "best_us": tiles[best], "best_GBps": w_bytes / tiles[best] / 1e3,
            "cublas_GBps": w_bytes / cublas_us / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = [dict(measure(n, k, t), shape=name) for name, (n, k) in SHAPES.items()
            for t in range(1, GEMV_MAX_TOKENS + 1)]
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "commit": args.commit,
                                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "rows": rows}, indent=1))
    print("shape  T  cuBLAS us  GEMV default us  best tiles  best us  best GB/s")
    for r in rows:
        print(f"{r['shape']:5s} {r['tokens']:2d} {r['cublas_us']:9.1f} {r['default_us']:16.1f} "
              f"{r['best']:>10s} {r['best_us']:8.1f} {r['best_GBps']:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
