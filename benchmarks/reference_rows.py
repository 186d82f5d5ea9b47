"""The reference rows of bench_moe.py's table: the MoE layer as bf16 torch
products per touched expert (what a plain engine would run), and the paged
decode attention at Mixtral's geometry. Skipped with --kernels-only."""

from __future__ import annotations

import math

import torch

from benchmarks.graph_timing import MAX_ROTATIONS, ROTATE_TARGET, bench_graph
from benchmarks.moe_setup import MoeShape, routing
from kernels.paged_attention import kv_cache_view, paged_attention_decode


def bf16_rows(shape: MoeShape, batches, hbm: float):
    """Reference: bf16 torch, x @ w.T per touched expert, static routing, in a graph."""
    per_expert = 3 * shape.hidden * shape.ffn * 2
    copies = max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_TARGET / (per_expert * min(shape.experts, shape.top_k)))))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [[torch.randn(3, shape.ffn, shape.hidden, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
           for _ in range(shape.experts)] for _ in range(copies)]
    rows = []
    for batch in batches:
        ids, tw = routing(shape, batch, "cuda")
        x = torch.randn(batch, shape.hidden, device="cuda", dtype=torch.bfloat16)
        hits = [(ids == e).nonzero() for e in range(shape.experts)]
        used = [(e, h[:, 0].contiguous(), tw[h[:, 0], h[:, 1]][:, None].to(torch.bfloat16))
                for e, h in enumerate(hits) if h.numel()]
        out = torch.empty(batch, shape.hidden, device="cuda", dtype=torch.bfloat16)

        def run(i=0):
            out.zero_()
            for e, tok, w in used:
                w13 = ws[i % copies][e]
                xe = x[tok]
                h = torch.nn.functional.silu(xe @ w13[0].T) * (xe @ w13[1].T)
                out.index_add_(0, tok, (h @ w13[2]) * w)  # w13[2] holds down^T [F, H]

        ms = bench_graph(run, copies)
        wbytes = len(used) * per_expert
        gbps = (wbytes + batch * shape.hidden * 4) / ms / 1e6
        rows.append(dict(model=shape.name, batch=batch, bits="bf16-torch", time_us=ms * 1e3,
                         weight_bytes=wbytes, GBps=gbps, pct_hbm=100 * gbps / hbm))
        print(f"{shape.name:18s} B={batch:3d} bf16 torch {ms * 1e3:8.1f} us {gbps:7.0f} GB/s "
              f"{100 * gbps / hbm:5.1f}% HBM", flush=True)
    del ws
    torch.cuda.empty_cache()
    return rows


def attention_rows(hbm: float):
    """Paged decode attention, Mixtral geometry (32 q heads, 8 kv heads, d 128)."""
    layers, bs, kvh, d, nh = 4, 16, 8, 128, 32
    rows = []
    for batch, ctx in [(1, 4096), (16, 1024), (64, 1024), (64, 4096)]:
        blocks = ctx // bs
        pages = batch * blocks
        page_bytes = layers * 2 * bs * kvh * d * 2
        storage = torch.empty(pages, page_bytes, dtype=torch.uint8, device="cuda")
        cache = kv_cache_view(storage, layers, bs, kvh, d, torch.bfloat16)
        cache.normal_()
        table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, blocks)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, nh, d, device="cuda", dtype=torch.bfloat16)
        ms = bench_graph(lambda i=0: paged_attention_decode(q, cache, i % layers, table, lens), layers)
        kv_bytes = batch * ctx * 2 * kvh * d * 2
        gbps = kv_bytes / ms / 1e6
        rows.append(dict(batch=batch, context=ctx, time_us=ms * 1e3, kv_bytes=kv_bytes, GBps=gbps,
                         pct_hbm=100 * gbps / hbm))
        print(f"paged decode attn B={batch:3d} ctx={ctx:5d} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s "
              f"{100 * gbps / hbm:5.1f}% HBM", flush=True)
        del storage, cache
    torch.cuda.empty_cache()
    return rows
