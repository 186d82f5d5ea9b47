"""Router launch(es) on the GPU: gate_route (logits + routing in one launch)
against the logits GEMM (torch, cuBLAS) + route, per gate shape and token
count; writes JSON.

    python3 benchmarks/bench_router.py --out results.json [--commit C]

Times are medians of triton.testing.do_bench_cudagraph (launch gaps as in
the engine's decode graphs), statistics recorded as the engine does. The
gate matrix is small enough to stay in L2 between replays, as it does in a
decode step only if nothing evicts it (a real step streams GBs of expert
weights in between, so these times are lower bounds for both paths).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import git_commit  # noqa: E402
from kernels.router import RoutingTargets, gate_route, route  # noqa: E402

# (experts, hidden): Mixtral-8x7B, a wider hidden, Qwen1.5-MoE's 60 experts.
SHAPES = ((8, 4096), (8, 6144), (60, 2048))
TOKENS = (1, 16, 64, 256)
TOP_K = 2


def targets(t: int, e: int) -> RoutingTargets:
    dev = "cuda"
    return RoutingTargets(routed=torch.zeros(e, dtype=torch.int64, device=dev),
                          mass=torch.zeros(e, dtype=torch.float32, device=dev),
                          seq_mass=torch.zeros(t, e, dtype=torch.float32, device=dev),
                          token_seq=torch.arange(t, device=dev), token_weight=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    args = ap.parse_args()
    rows = []
    for e, h in SHAPES:
        w = torch.randn(e, h, device="cuda", dtype=torch.bfloat16) * 0.02
        for t in TOKENS:
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            tg = targets(t, e)
            fused = triton.testing.do_bench_cudagraph(lambda: gate_route(x, w, TOP_K, tg), return_mode="median")
            split = triton.testing.do_bench_cudagraph(lambda: route(x @ w.T, TOP_K, tg), return_mode="median")
            rows.append(dict(experts=e, hidden=h, tokens=t, gate_route_us=fused * 1e3, gemm_route_us=split * 1e3))
            print(f"E={e:3d} H={h:5d} T={t:4d}: gate_route {fused * 1e3:6.2f} us, GEMM + route {split * 1e3:6.2f} us",
                  flush=True)
    result = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                  top_k=TOP_K, rows=rows)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
