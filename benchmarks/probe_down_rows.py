"""The one-token down launch with two weight rows per thread (256 rows on 4
warps) against one (128 rows): Mixtral and Qwen1.5-MoE shapes, B=1, each
view; prints us per layer and per launch, writes $OUT/probe_bn256_s14.json.
An exploration (benchmarks/results/moe_down_rows_b1_s14_h200.json), GPU only:

    OUT=/tmp python3 benchmarks/probe_down_rows.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_moe as bm  # noqa: E402
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference  # noqa: E402
from kernels.moe_tiles import MoeTiles  # noqa: E402

VIEWS = ("2", "4", "8", "mixed")


def probe_shape(shape, out: dict) -> None:
    smallest = bm.block_bytes(shape, 0, 1) * 2 + bm.block_bytes(shape, 2, 1)
    layers = bm.rotations(shape, smallest * min(shape.experts, shape.top_k), bm.MAX_ROTATIONS)
    page = bm.PAGE_BYTES[shape.name]
    weights = bm.build_store(shape, layers, page, "cuda")
    ids, tw = bm.routing(shape, 1, "cuda")
    x = torch.randn(1, shape.hidden, device="cuda", dtype=torch.bfloat16)
    up = 128 if shape.name.startswith("mixtral") else 64  # choose_tiles' gate/up rows at B=1
    # (down rows, split): one row per thread as choose_tiles builds it, then
    # two rows per thread (only with 4-warp gate/up programs of 128 rows)
    layouts = [(up, 4)] + ([(256, 4), (256, 8)] if up == 128 else [])
    for bits in VIEWS:
        weights.block_fields.copy_(bm.fields_config(shape, layers, bits))
        for rows, split in layouts:
            tiles = MoeTiles(block_n_up=up, block_n_down=rows, block_m=1, split_k=split, num_warps=up // 32,
                             use_asm=True, balance_down=shape.experts <= 16)
            ws = alloc_workspace(1, shape.top_k, shape.hidden, shape.ffn, shape.experts, tiles, "cuda")
            res = fused_moe_mixed(x, ids, tw, weights, 0, shape.experts, shape.ffn, tiles, ws).clone()
            ref = moe_mixed_reference(x, ids, tw, weights, 0, shape.experts, shape.ffn)
            err = float((res - ref).norm() / ref.norm())
            ms = bm.bench_graph(lambda i=0: fused_moe_mixed(x, ids, tw, weights, i % layers, shape.experts,
                                                            shape.ffn, tiles, ws), layers)
            stages = bm.stage_times(shape, x, ids, tw, weights, tiles, ws, layers, page)
            key = f"{shape.name} {bits} down{rows} split{split}"
            out[key] = dict(us=ms * 1e3, err=err, stages=stages)
            print(f"{key}: {ms * 1e3:.1f} us err {err:.2e} down {stages['down']:.1f} "
                  f"gate_up {stages['gate_up']:.1f}", flush=True)
    del weights
    torch.cuda.empty_cache()


def main() -> None:
    out: dict = {}
    for shape in (bm.MIXTRAL, bm.QWEN):
        probe_shape(shape, out)
    Path(os.environ["OUT"], "probe_bn256_s14.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
