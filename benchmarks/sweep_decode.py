"""Sweep of the paged decode loop (kernels/moe_block_matmul.block_matmul) on one
Mixtral gate block (14336 x 4096) at each view, M = 1 token, K split so that
about 450 programs run (as the gate/up launch at B = 1). Writes JSON.

    python3 benchmarks/sweep_decode.py --out sweep.json [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_setup import MIXTRAL, block_bytes, build_store  # noqa: E402
from kernels.moe_block_matmul import block_matmul  # noqa: E402
from kernels.weight_layout import NUM_PLANES, permute_groups, plane_scales  # noqa: E402

COPIES = 8  # 8 copies of the 3 blocks of one expert, gate blocks rotated
PAGE_BYTES = 2 * 2**20
SPLIT = 4


@triton.jit(do_not_specialize=["block", "log2p", "per_split"])
def _probe_kernel(
    xp_ptr,  # [3, M, K] fp16 activation planes, virtual order (weight_layout.plane_scales)
    xsum_ptr,  # [M, K / 128] fp32
    arena_ptr,  # int32 arena words
    pt_ptr,  # [blocks, 5, max_pages] int64 page offsets
    out_ptr,  # [N, BM] fp32, accumulated
    block, N, K, pt_block_stride, pt_field_stride, log2p, per_split, n_tokens,
    NF: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    g0 = tl.program_id(1) * per_split
    g1 = tl.minimum(g0 + per_split, K // 128)
    m = tl.arange(0, BM)
    valid = m < n_tokens
    kv = tl.arange(0, 128)
    tok = m.to(tl.int64)
    acc = block_matmul(arena_ptr, pt_ptr + block.to(tl.int64) * pt_block_stride, pt_field_stride, N, K, n,
                       g0, g1, log2p, xp_ptr + tok[None, :] * K + kv[:, None], valid[None, :],
                       xsum_ptr + tok * (K // 128), valid, 1, n_tokens * K, 1, NF, BN, BM, USE_ASM)
    tl.atomic_add(out_ptr + n[:, None] * BM + m[None, :], acc, mask=valid[None, :], sem="relaxed")


def variants():
    out = []
    for nf in (1, 2, 3, 4, 5):
        for stages in (2, 3, 4):
            out.append(dict(nf=nf, bn=128, stages=stages, asm=nf >= 2, warps=4))
        if nf >= 2:
            out.append(dict(nf=nf, bn=128, stages=3, asm=False, warps=4))
        out.append(dict(nf=nf, bn=64, stages=3, asm=nf >= 2, warps=4))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=150.0)
    args = ap.parse_args()
    start = time.time()
    shape = MIXTRAL
    weights = build_store(shape, COPIES // shape.experts + 1, PAGE_BYTES, "cuda")
    n, k = shape.ffn, shape.hidden
    x = torch.randn(1, k, device="cuda")
    xv = permute_groups(x).view(1, k // 128, 128)
    xp = torch.stack([(xv * plane_scales(p).cuda()).to(torch.float16).view(1, k) for p in range(NUM_PLANES)])
    xsum = xv.sum(-1).contiguous()
    pt = weights.page_table
    arena = weights.storage.view(torch.int32)
    rows = []
    for v in variants():
        if time.time() - start > args.budget:
            rows.append(dict(v, skipped="time budget"))
            continue
        out = torch.zeros(n, 16, device="cuda")
        per_split = triton.cdiv(k // 128, SPLIT)

        def launch(i=0, v=v, out=out):
            blk = (i % COPIES) * 3  # gate block of expert i (copies of layers/experts)
            _probe_kernel[(n // v["bn"], SPLIT)](
                xp, xsum, arena, pt, out, blk, n, k, pt.stride(0), pt.stride(1),
                PAGE_BYTES.bit_length() - 1, per_split, 1, NF=v["nf"], BN=v["bn"], BM=16,
                USE_ASM=v["asm"], num_warps=v["warps"], num_stages=v["stages"])
        try:
            t0 = time.time()
            launch()
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(COPIES):
                    launch(i)
            ms = triton.testing.do_bench(graph.replay, warmup=20, rep=100, return_mode="median") / COPIES
            nbytes = block_bytes(shape, 0, v["nf"])
            rows.append(dict(v, us=ms * 1e3, GBps=nbytes / ms / 1e6, compile_s=compile_s))
            print(f"NF={v['nf']} BN={v['bn']} st={v['stages']} asm={int(v['asm'])}: {ms * 1e3:6.1f} us "
                  f"{nbytes / ms / 1e6:6.0f} GB/s (compile {compile_s:.1f}s)", flush=True)
        except Exception as exc:  # a variant that fails to build is recorded, not fatal
            rows.append(dict(v, error=repr(exc)[:300]))
            print(f"variant {v} failed: {exc!r}"[:300], flush=True)
    Path(args.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(0), split=SPLIT,
                                              page_bytes=PAGE_BYTES, rows=rows), indent=1))


if __name__ == "__main__":
    main()
