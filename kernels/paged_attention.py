"""Attention over the paged KV arena: the cache's view, KV writes, prefill
(decode: kernels/paged_decode.py).

The KV cache is the arena's storage viewed as
[pages, layers, 2, block_size, kv_heads, head_dim] (kv_cache_view): one page
holds block_size tokens of every layer. A sequence's pages are listed in its
block-table row (int32 [seqs, max_blocks]); context_lens (int32 [seqs]) says
how many tokens are valid.

* write_kv_cache: stores new tokens' K and V at their slots (page * block_size
  + offset; negative = skip).
* prefill_attention: causal attention over the new tokens of each sequence
  (contiguous, varlen via cu_seqlens), not read from the cache.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

MIN_DOT = 16  # smallest tl.dot dimension


def kv_cache_view(storage: torch.Tensor, num_layers: int, block_size: int, kv_heads: int,
                  head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """storage uint8 [pages, page_bytes] as [pages, layers, 2, block_size, kv_heads, head_dim]."""
    elems = num_layers * 2 * block_size * kv_heads * head_dim
    esize = torch.empty(0, dtype=dtype).element_size()
    if storage.dtype != torch.uint8 or storage.dim() != 2 or storage.shape[1] != elems * esize:
        raise ValueError(f"page_bytes must be {elems * esize} for this KV geometry, got "
                         f"{tuple(storage.shape)} {storage.dtype}")
    return storage.view(dtype).view(storage.shape[0], num_layers, 2, block_size, kv_heads, head_dim)


@triton.jit
def online_softmax_step(q, k, v, visible, sm_scale, m_i, l_i, acc):
    """One key block of flash attention: q [M, D], k, v [N, D], visible
    [M or 1, N] (False scores count as -inf); running max m_i [M], sum of
    exponentials l_i [M], numerator acc [M, D] fp32 -> their updates."""
    sc = tl.dot(q, tl.trans(k)) * sm_scale  # [M, N]
    sc = tl.where(visible, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [T, KVH, D]
    v_ptr,  # [T, KVH, D]
    kv_ptr,  # [pages, layers, 2, BS, KVH, D]
    slot_ptr,  # [T] int64 slot = page * BS + offset, < 0 = skip
    layer, page_stride, KVH,
    BS: tl.constexpr, ROW: tl.constexpr, ROW_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        i = tl.arange(0, ROW_PAD)
        mask = i < ROW
        dst = kv_ptr + (slot // BS) * page_stride + layer * (2 * BS * ROW) + (slot % BS) * ROW + i
        tl.store(dst, tl.load(k_ptr + t * ROW + i, mask=mask), mask=mask)
        tl.store(dst + BS * ROW, tl.load(v_ptr + t * ROW + i, mask=mask), mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, layer: int,
                   slot_mapping: torch.Tensor) -> None:
    """Stores k, v [T, KVH, D] into the cache at slots (int [T]; < 0 skips)."""
    t, kvh, dim = k.shape
    if v.shape != k.shape or kv_cache.shape[4:] != (kvh, dim) or slot_mapping.shape != (t,):
        raise ValueError("k, v must be [T, KVH, D] matching the cache; slot_mapping [T]")
    if k.dtype != kv_cache.dtype or v.dtype != kv_cache.dtype:
        raise ValueError("k, v and the cache must share a dtype")
    if not 0 <= layer < kv_cache.shape[1]:
        raise ValueError(f"layer {layer} out of range")
    if t == 0:
        return
    row = kvh * dim
    _write_kv_kernel[(t,)](k.contiguous(), v.contiguous(), kv_cache, slot_mapping.to(torch.int64),
                           layer, kv_cache.stride(0), kvh, BS=kv_cache.shape[3], ROW=row,
                           ROW_PAD=triton.next_power_of_2(row), num_warps=4)


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, NH, D]
    k_ptr,  # [T, KVH, D]
    v_ptr,  # [T, KVH, D]
    cu_ptr,  # [S + 1] int32 sequence starts
    out_ptr,  # [T, NH, D]
    sm_scale, NH, KVH,
    G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    mt = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    start = tl.load(cu_ptr + seq)
    length = tl.load(cu_ptr + seq + 1) - start
    m0 = mt * BM
    if m0 < length:
        kvh = head // G
        i = m0 + tl.arange(0, BM)
        d = tl.arange(0, D)
        imask = i < length
        q = tl.load(q_ptr + ((start + i[:, None]).to(tl.int64) * NH + head) * D + d[None, :],
                    mask=imask[:, None], other=0.0)
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        end = tl.minimum(length, m0 + BM)
        for n0 in range(0, end, BN):
            j = n0 + tl.arange(0, BN)
            jmask = j < length
            kv_off = ((start + j[:, None]).to(tl.int64) * KVH + kvh) * D + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=jmask[:, None], other=0.0)
            v = tl.load(v_ptr + kv_off, mask=jmask[:, None], other=0.0)
            visible = (j[None, :] <= i[:, None]) & jmask[None, :]
            m_i, l_i, acc = online_softmax_step(q, k, v, visible, sm_scale, m_i, l_i, acc)
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + ((start + i[:, None]).to(tl.int64) * NH + head) * D + d[None, :],
                 res.to(out_ptr.dtype.element_ty), mask=imask[:, None])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      max_seqlen: int, sm_scale: float | None = None,
                      block: int = 64, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens: q [T, NH, D], k, v [T, KVH, D]."""
    t, nh, dim = q.shape
    if k.shape[0] != t or k.shape != v.shape or nh % k.shape[1] or k.shape[2] != dim:
        raise ValueError("q [T, NH, D], k, v [T, KVH, D] with NH a multiple of KVH")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise ValueError("cu_seqlens must be int32 [S + 1]")
    if dim < MIN_DOT or dim & (dim - 1) or block < MIN_DOT or block & (block - 1):
        raise ValueError("head_dim and block must be powers of two >= 16")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor like q")
    seqs = cu_seqlens.shape[0] - 1
    if t == 0 or seqs == 0 or max_seqlen == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    grid = (triton.cdiv(max_seqlen, block), nh, seqs)
    _prefill_kernel[grid](q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, out, scale, nh,
                          k.shape[1], G=nh // k.shape[1], D=dim, BM=block, BN=block, num_warps=4)
    return out


# -- plain-torch references ------------------------------------------------------
def prefill_attention_reference(q, k, v, cu_seqlens, sm_scale=None):
    nh, dim = q.shape[1], q.shape[2]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i in range(cu_seqlens.shape[0] - 1):
        a, b = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        if a == b:
            continue
        qs = q[a:b].float()
        ks = k[a:b].float().repeat_interleave(nh // k.shape[1], dim=1)
        vs = v[a:b].float().repeat_interleave(nh // k.shape[1], dim=1)
        att = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        out[a:b] = torch.einsum("hij,jhd->ihd", att.softmax(-1), vs)
    return out
