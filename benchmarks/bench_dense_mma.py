"""The decode tensor-core product (kernels/dense_mma.py) against cuBLAS at
the Mixtral-8x7B attention projections, 2-64 tokens, over launch shapes.
One command (GPU), writes JSON and prints a short table last:

    python benchmarks/bench_dense_mma.py --commit <sha> --out benchmarks/results/dense_mma_h200.json

Method as benchmarks/bench_gemv.py: one launch's share of a CUDA graph of
back-to-back launches cycling over W copies past the L2. Each tile is timed
twice: PDL off (the kernel alone) and PDL on, where each launch's programs
become resident under the one before (kernels/pdl.py) as they would in the
decode step after a launch that takes part; cuBLAS takes no part, so its
one time is both. GB/s counts W's bytes once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_gemv import SHAPES, graph_us, projection  # noqa: E402
from kernels.dense_mma import MMA_MAX_TOKENS, MmaTiles, default_tiles, dense_mma, pipeline_stages  # noqa: E402
from kernels.pdl import PdlPolicy  # noqa: E402

BLOCK_N = (32, 64, 128)
BLOCK_K = (128, 256)
STAGES = (3, 4, 5)
NO_PDL = PdlPolicy(max_rows=0)
ALL_PDL = PdlPolicy(max_rows=MMA_MAX_TOKENS)


def tile_key(t: MmaTiles) -> str:
    return f"{t.block_n}x{t.block_k}s{t.num_stages}" + (f"w{t.num_warps}" if t.num_warps != 4 else "")


def measure(n: int, k: int, tokens: int, candidates: list[MmaTiles]) -> dict:
    p = projection(n, k, tokens)
    w_bytes, copies, ws, x, out, want, cublas_us = p.w_bytes, p.copies, p.ws, p.x, p.out, p.want, p.cublas_us
    alone, chained, skipped = {}, {}, {}
    for asked in candidates:
        # The stages the launch will take at this token count (dense_mma fits them to the shared memory).
        t = replace(asked, num_stages=pipeline_stages(asked, tokens, x.element_size()))
        if tile_key(t) in alone:
            continue
        try:
            got = dense_mma(x, ws[0], t, pdl=NO_PDL)
        except OutOfResources as exc:  # too many stages for the shared memory
            skipped[tile_key(t)] = str(exc)[:200]
            continue
        err = float((got.float() - want.float()).norm() / want.float().norm())
        if err > 1e-2:
            raise RuntimeError(f"dense_mma {t} off by {err} at {n}x{k}, {tokens} tokens")
        alone[tile_key(t)] = graph_us(lambda i, t=t: dense_mma(x, ws[i], t, out=out, pdl=NO_PDL), copies)
        chained[tile_key(t)] = graph_us(lambda i, t=t: dense_mma(x, ws[i], t, out=out, pdl=ALL_PDL), copies)
    best = min(chained, key=chained.get) if chained else None
    shipped = default_tiles(tokens)
    default = tile_key(replace(shipped, num_stages=pipeline_stages(shipped, tokens, x.element_size())))
    return {"n": n, "k": k, "tokens": tokens, "w_bytes": w_bytes, "copies": copies, "cublas_us": cublas_us,
            "alone_us": alone, "pdl_us": chained, "skipped": skipped,
            "default": default, "default_alone_us": alone.get(default), "default_pdl_us": chained.get(default),
            "best_pdl": best, "best_pdl_us": chained.get(best),
            "best_alone": min(alone, key=alone.get) if alone else None,
            "cublas_GBps": w_bytes / cublas_us / 1e3, "best_pdl_GBps": w_bytes / chained[best] / 1e3 if best else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="16,64", help="token counts swept over every tile, comma-separated")
    ap.add_argument("--default-tokens", default="2,4,8,32",
                    help="token counts timed with the default tile only")
    ap.add_argument("--block-n", default=",".join(map(str, BLOCK_N)))
    ap.add_argument("--block-k", default=",".join(map(str, BLOCK_K)))
    ap.add_argument("--stages", default=",".join(map(str, STAGES)))
    args = ap.parse_args()

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(v) for v in text.split(",") if v)

    sweep = [MmaTiles(block_n=bn, block_k=bk, num_stages=s)
             for bn, bk, s in itertools.product(ints(args.block_n), ints(args.block_k), ints(args.stages))]
    cases = [(t, sweep) for t in ints(args.tokens)] + [(t, [default_tiles(t)]) for t in ints(args.default_tokens)]
    rows = [dict(measure(n, k, t, cands), shape=name) for name, (n, k) in SHAPES.items()
            for t, cands in sorted(cases)]
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "commit": args.commit,
                                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__,
                                    "method": "graph of back-to-back launches over rotated W copies; "
                                              "alone: PDL off, pdl: every launch taking part",
                                    "rows": rows}, indent=1))
    print("shape  T  cuBLAS us  default alone/pdl us  best pdl tiles  us  GB/s (cuBLAS GB/s)")
    for r in rows:
        for key, why in r["skipped"].items():
            print(f"  skipped {r['shape']} T={r['tokens']} {key}: {why}")
        if r["best_pdl"] is None:
            print(f"{r['shape']:5s} {r['tokens']:2d} {r['cublas_us']:9.1f}  no tile ran")
            continue
        print(f"{r['shape']:5s} {r['tokens']:2d} {r['cublas_us']:9.1f} {r['default_alone_us'] or 0:8.1f} / "
              f"{r['default_pdl_us'] or 0:5.1f} {r['best_pdl']:>14s} {r['best_pdl_us']:5.1f} "
              f"{r['best_pdl_GBps']:5.0f} ({r['cublas_GBps']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
