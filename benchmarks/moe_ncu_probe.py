"""One Mixtral MoE layer, a few launches, for Nsight Compute to read.

    ncu --clock-control none -k regex:_moe_gate_up --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats ... \
        python3 benchmarks/moe_ncu_probe.py --batch 1 --bits 4

Not a benchmark (ncu serialises and replays kernels; its times are not the
serving times): it exists so that counter readings (stall reasons, achieved
occupancy, DRAM throughput) of the exact launch shapes the benchmarks time
can be taken with one command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_setup import MIXTRAL, ROUTINGS, build_store, fields_config, routing  # noqa: E402
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed  # noqa: E402
from kernels.moe_tile_choice import choose_tiles  # noqa: E402
from kernels.moe_tuning import MoeTuning  # noqa: E402

PAGE_BYTES = 2 * 2**20
LAUNCHES = 5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--bits", default="4")
    ap.add_argument("--routing", default="roundrobin", choices=ROUTINGS)
    ap.add_argument("--wide", type=int, default=None,
                    help="token tile for experts over the base tile (0 = none; default: choose_tiles)")
    ap.add_argument("--triton-carveout", action="store_true",
                    help="keep the carveout Triton's loader sets (default: MoeTiles.limit_carveout)")
    ap.add_argument("--tuning", default="{}",
                    help='MoeTuning fields as JSON, e.g. \'{"one_token_maxnreg": 168}\' (default: the shipped values)')
    args = ap.parse_args()
    tuning = MoeTuning(**json.loads(args.tuning))
    shape = MIXTRAL
    weights = build_store(shape, 1, PAGE_BYTES, "cuda")
    weights.block_fields.copy_(fields_config(shape, 1, args.bits))
    ids, tw = routing(shape, args.batch, "cuda", mode=args.routing)
    x = torch.randn(args.batch, shape.hidden, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = choose_tiles(args.batch, shape.top_k, shape.experts, shape.hidden, shape.ffn, sms, use_asm=True,
                         block_m_wide=args.wide, limit_carveout=not args.triton_carveout, tuning=tuning)
    ws = alloc_workspace(args.batch, shape.top_k, shape.hidden, shape.ffn, shape.experts, tiles, "cuda")
    for _ in range(LAUNCHES):
        fused_moe_mixed(x, ids, tw, weights, 0, shape.experts, shape.ffn, tiles, ws)
    torch.cuda.synchronize()
    print(f"probe done: B={args.batch} bits={args.bits} tiles={tiles}")


if __name__ == "__main__":
    main()
