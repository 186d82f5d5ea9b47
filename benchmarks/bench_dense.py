"""Dense decode projections on the GPU: torch's GEMM (cuBLAS) against the
one-pass skinny kernel (kernels/skinny_linear.py), at the attention and LM
head shapes of Mixtral-8x7B and Qwen1.5-MoE-A2.7B.

One command, JSON out:
    python benchmarks/bench_dense.py --commit $(git rev-parse --short HEAD) --out dense_h200.json

Times are medians of triton.testing.do_bench over CUDA-graph replays of calls
that rotate over copies of the weight (more bytes than the L2; do_bench also
flushes it), so the weight comes from HBM as in a decode step. --sweep also
times a grid of launch shapes (what choose_skinny_tiles picks from).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import L2_BYTES, MAX_ROTATIONS, bench_graph, copy_bandwidth  # noqa: E402

from kernels.skinny_linear import SkinnyTiles, choose_skinny_tiles, skinny_linear, stage_bytes  # noqa: E402

# (name, out_features N, in_features K): Mixtral q+k+v fused, o, LM head;
# Qwen1.5-MoE q+k+v fused, o.
SHAPES = [
    ("mixtral.qkv", 6144, 4096),
    ("mixtral.o", 4096, 4096),
    ("mixtral.lm_head", 32000, 4096),
    ("qwen.qkv", 6144, 2048),
    ("qwen.o", 2048, 2048),
]
BATCHES = [1, 4, 16, 64]
SWEEP = dict(block_n=(16, 32, 64), block_k=(128, 256), num_stages=(3, 5))
GEMV_SWEEP = dict(block_n=(4, 8, 16), block_k=(256, 512, 1024), num_warps=(4, 8), num_stages=(1, 3))
GEMV_ACC_REGS = 64  # fp32 accumulator registers per thread at most (more would spill)
SMEM_PER_BLOCK = 227 * 1024  # H200 (sm_90) opt-in shared memory per block


def weights_for(n: int, k: int) -> list[torch.Tensor]:
    """Copies of one [n, k] bf16 weight, together over twice the L2."""
    copies = max(1, min(MAX_ROTATIONS, math.ceil(2 * L2_BYTES / (n * k * 2))))
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(copies)]


def time_us(fn, ws: list[torch.Tensor]) -> float:
    return 1e3 * bench_graph(lambda i=0: fn(ws[i % len(ws)]), len(ws))


def sweep_tiles(name: str, x: torch.Tensor, ws: list[torch.Tensor], batch: int) -> list[dict]:
    """Tensor-core tiles at B = 16; GEMV tiles at B = 1, 2 and 4."""
    grid = []
    if batch == 16:
        block_t = 16
        grid = [SkinnyTiles(block_t=block_t, block_n=bn, block_k=bk, num_stages=st)
                for bn, bk, st in itertools.product(*SWEEP.values())]
        grid = [t for t in grid if stage_bytes(t) <= SMEM_PER_BLOCK]
    elif batch in (1, 2, 4):
        grid = [SkinnyTiles(block_t=batch, block_n=bn, block_k=bk, num_warps=nw, num_stages=st)
                for bn, bk, nw, st in itertools.product(*GEMV_SWEEP.values())]
        grid = [t for t in grid if t.block_t * t.block_n * t.block_k <= GEMV_ACC_REGS * 32 * t.num_warps]
    out = []
    for t in grid:
        us = time_us(lambda w, t=t: skinny_linear(x, w, tiles=t), ws)
        out.append(dict(shape=name, batch=batch, tiles=t.__dict__, us=us))
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sweep", action="store_true", help="also time a grid of launch shapes at B = 1, 2, 4 (GEMV) and 16 (tensor cores)")
    parser.add_argument("--commit", default="unknown", help="git commit of the measured tree")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def run(args: argparse.Namespace) -> tuple[float, list[dict], list[dict]]:
    batches = [int(b) for b in args.batches.split(",")]
    hbm = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, sweep = [], []
    for name, n, k in SHAPES:
        ws = weights_for(n, k)
        for batch in batches:
            x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
            want = torch.nn.functional.linear(x, ws[0]).float()
            err = ((skinny_linear(x, ws[0]).float() - want).norm() / want.norm()).item()
            tiles = choose_skinny_tiles(batch, n, sms)
            torch_us = time_us(lambda w: torch.nn.functional.linear(x, w), ws)
            skinny_us = time_us(lambda w: skinny_linear(x, w, tiles=tiles), ws)
            moved = n * k * 2 + batch * (n + k) * 2
            row = dict(shape=name, n=n, k=k, batch=batch, torch_us=torch_us, skinny_us=skinny_us,
                       tiles=tiles.__dict__, bytes=moved, rel_err=err,
                       torch_pct_hbm=100 * moved / torch_us / 1e3 / hbm,
                       skinny_pct_hbm=100 * moved / skinny_us / 1e3 / hbm)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.sweep and not name.startswith("qwen"):
                sweep += sweep_tiles(name, x, ws, batch)
        del ws
        torch.cuda.empty_cache()
        write_result(args, hbm, rows, sweep)  # after every shape: a timeout keeps what ran
    return hbm, rows, sweep


def write_result(args, hbm: float, rows: list[dict], sweep: list[dict]) -> None:
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/bench_dense.py", *sys.argv[1:]]),
        "commit": args.commit,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_GBps": hbm,
        "rows": rows,
        "sweep": sweep,
    }
    args.out.write_text(json.dumps(result, indent=1))


def print_tables(rows: list[dict], sweep: list[dict], hbm: float) -> None:
    if sweep:
        print("\nbest swept tiles (us):")
        for (name, batch), group in itertools.groupby(sweep, key=lambda r: (r["shape"], r["batch"])):
            best = min(group, key=lambda r: r["us"])
            print(f"{name:16s} B={batch:3d} {best['us']:8.1f}  {best['tiles']}")
    print(f"\ncopy {hbm:.0f} GB/s | {'shape':16s} {'B':>3s} {'torch us':>9s} {'%':>5s} {'skinny us':>9s} {'%':>5s}")
    for r in rows:
        print(f"{r['shape']:16s} {r['batch']:3d} {r['torch_us']:9.1f} {r['torch_pct_hbm']:5.1f} "
              f"{r['skinny_us']:9.1f} {r['skinny_pct_hbm']:5.1f}  err {r['rel_err']:.1e}")


def main() -> None:
    args = parse_args()
    hbm, rows, sweep = run(args)
    print_tables(rows, sweep, hbm)


if __name__ == "__main__":
    main()
