"""The torch path's prefill attention (dataplane/layers/attention.py) against
an explicit per-query softmax, through scattered KV blocks: cached prefixes
(queries that see more keys than they are), grouped heads and sliding
windows. On a GPU the unwindowed case runs SDPA's fused lower-right kernel."""

from __future__ import annotations

import math

import pytest
import torch

from dataplane.layers.attention import paged_prefill_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 8, 4
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
# fp16 on the GPU (the fused kernels take no fp32); its inputs are O(1), so 1e-2 covers the rounding.
ATOL = {torch.float32: 1e-5, torch.float16: 1e-2}


def reference(q, keys, values, context_len, window):
    """q [q_len, H, D], keys/values [ctx, KVH, D] in token order; float64 softmax per query."""
    q_len = q.shape[0]
    group = HEADS // KV_HEADS
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q_len):
        pos = context_len - q_len + i
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(HEADS):
            k = keys[lo : pos + 1, h // group].double()  # [n, D]
            v = values[lo : pos + 1, h // group].double()
            w = torch.softmax(k @ q[i, h].double() / math.sqrt(HEAD_DIM), dim=0)  # [n]
            out[i, h] = w @ v
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("context_len,q_len,window", [(11, 11, None), (11, 5, None), (13, 1 + 2, None),
                                                      (11, 5, 3), (9, 9, 4)])
def test_prefill_attention_sees_its_cached_prefix_through_scattered_blocks(device, context_len, q_len, window):
    dtype = torch.float32 if device == "cpu" else torch.float16
    gen = torch.Generator().manual_seed(context_len * 31 + q_len)
    num_blocks = -(-context_len // BLOCK)
    pool = 2 * num_blocks + 1
    keys = torch.randn(context_len, KV_HEADS, HEAD_DIM, generator=gen)
    values = torch.randn(context_len, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(q_len, HEADS, HEAD_DIM, generator=gen)
    # Scattered blocks; slots past the context hold NaN, which must never be read.
    block_table = torch.randperm(pool, generator=gen)[:num_blocks].to(torch.int32)
    k_cache = torch.full((pool, BLOCK, KV_HEADS, HEAD_DIM), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    for t in range(context_len):
        k_cache[block_table[t // BLOCK], t % BLOCK] = keys[t]
        v_cache[block_table[t // BLOCK], t % BLOCK] = values[t]
    out = paged_prefill_attention(q.to(device, dtype), k_cache.to(device, dtype), v_cache.to(device, dtype),
                                  block_table.to(device), context_len, 1 / math.sqrt(HEAD_DIM), window)
    assert out.shape == (q_len, HEADS, HEAD_DIM) and out.dtype == dtype
    want = reference(q.to(dtype), keys.to(dtype), values.to(dtype), context_len, window)
    torch.testing.assert_close(out.double().cpu(), want, atol=ATOL[dtype], rtol=0)
