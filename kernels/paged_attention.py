"""Attention over the paged KV arena: decode (GQA, split context), KV writes, prefill.

The KV cache is the arena's storage viewed as
[pages, layers, 2, block_size, kv_heads, head_dim] (kv_cache_view): one page
holds block_size tokens of every layer. A sequence's pages are listed in its
block-table row (int32 [seqs, max_blocks]); context_lens (int32 [seqs]) says
how many tokens are valid.

* paged_attention_decode: one query token per sequence. A program takes one
  (sequence, kv head, context partition) and all query heads of that kv head,
  so each K/V block is read once for the whole group; partitions are merged by
  a second small kernel (flash-decoding) when there are several.
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

from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

MIN_DOT = 16  # smallest tl.dot dimension
PROGRAMS_PER_SM = 2  # decode programs per multiprocessor that fill the GPU (264 on an H100 or H200)


def kv_cache_view(storage: torch.Tensor, num_layers: int, block_size: int, kv_heads: int,
                  head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """storage uint8 [pages, page_bytes] as [pages, layers, 2, block_size, kv_heads, head_dim]."""
    elems = num_layers * 2 * block_size * kv_heads * head_dim
    esize = torch.empty(0, dtype=dtype).element_size()
    if storage.dtype != torch.uint8 or storage.dim() != 2 or storage.shape[1] != elems * esize:
        raise ValueError(f"page_bytes must be {elems * esize} for this KV geometry, got "
                         f"{tuple(storage.shape)} {storage.dtype}")
    return storage.view(dtype).view(storage.shape[0], num_layers, 2, block_size, kv_heads, head_dim)


# max_blocks (the batch's block-table width in an eager step) and layer are
# not specialized: a width off a multiple of 16 compiled a variant of its own,
# live, in eager decode steps (then taken while a block was host-only); see also
# default_partitions.
@triton.jit(do_not_specialize=["max_blocks", "layer"])
def _decode_kernel(
    q_ptr,  # [S, NH, D]
    kv_ptr,  # [pages, layers, 2, BS, KVH, D]
    bt_ptr,  # [S, max_blocks] int32
    ctx_ptr,  # [S] int32
    out_ptr,  # [S, NH, D] (used when P == 1)
    pm_ptr,  # [S, NH, P] fp32 partition running max (P > 1)
    pl_ptr,  # [S, NH, P] fp32 partition sum of exp
    pacc_ptr,  # [S, NH, P, D] fp32 partition numerator
    layer, sm_scale, max_blocks, page_stride, NH, KVH,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, P: tl.constexpr,
    PDL: tl.constexpr,
):
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    # The context length and the first block's page are the step's inputs,
    # which no launch of the step writes: loaded through the L2 before the
    # PDL wait (kernels/pdl.py), they leave one round trip (q, K, V) after it.
    ctx = tl.load(ctx_ptr + s, cache_modifier=".cg")
    n_blocks = tl.cdiv(ctx, BS)
    per_part = tl.cdiv(n_blocks, P)
    b0 = part * per_part
    b1 = tl.minimum(b0 + per_part, n_blocks)
    bt_row = bt_ptr + s.to(tl.int64) * max_blocks
    page_next = tl.load(bt_row + b0, mask=b0 < b1, other=0, cache_modifier=".cg")
    wait_for_previous_grid(PDL)
    gi = tl.arange(0, G_PAD)
    heads = kvh * G + gi
    hmask = gi < G
    d = tl.arange(0, D)
    t = tl.arange(0, BS)
    q = tl.load(q_ptr + (s * NH + heads[:, None]).to(tl.int64) * D + d[None, :], mask=hmask[:, None], other=0.0)
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    tok_off = t[:, None] * (KVH * D) + kvh * D + d[None, :]  # [BS, D]
    layer_off = layer * (2 * BS * KVH * D)
    for b in range(b0, b1):
        # This block's page was loaded one iteration ahead, the next one's now.
        page = page_next.to(tl.int64)
        page_next = tl.load(bt_row + b + 1, mask=b + 1 < b1, other=0, cache_modifier=".cg")
        base = kv_ptr + page * page_stride + layer_off
        # Slots past the context hold stale bytes (a page freed by a demoted
        # expert block, say) that may read as NaN: never load them (0 * NaN = NaN).
        live = b * BS + t < ctx  # [BS]
        k = tl.load(base + tok_off, mask=live[:, None], other=0.0)  # [BS, D]
        v = tl.load(base + BS * KVH * D + tok_off, mask=live[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k)) * sm_scale  # [G_PAD, BS]
        sc = tl.where(live[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    row = s * NH + heads
    if P == 1:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + row[:, None].to(tl.int64) * D + d[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=hmask[:, None])
    else:
        tl.store(pm_ptr + row * P + part, m_i, mask=hmask)
        tl.store(pl_ptr + row * P + part, l_i, mask=hmask)
        tl.store(pacc_ptr + (row[:, None] * P + part).to(tl.int64) * D + d[None, :], acc, mask=hmask[:, None])


@triton.jit
def _decode_merge_kernel(
    pm_ptr,  # [S * NH, P] fp32
    pl_ptr,  # [S * NH, P] fp32
    pacc_ptr,  # [S * NH, P, D] fp32
    out_ptr,  # [S * NH, D]
    P: tl.constexpr, P_PAD: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_grid(PDL)
    row = tl.program_id(0).to(tl.int64)
    pi = tl.arange(0, P_PAD)
    pmask = pi < P
    d = tl.arange(0, D)
    m = tl.load(pm_ptr + row * P + pi, mask=pmask, other=float("-inf"))
    l = tl.load(pl_ptr + row * P + pi, mask=pmask, other=0.0)
    acc = tl.load(pacc_ptr + (row * P + pi[:, None]) * D + d[None, :], mask=pmask[:, None], other=0.0)
    mx = tl.max(m, axis=0)
    # An empty sequence has every m at -inf: shift by 0 then, not by mx
    # (-inf - -inf is NaN, which the select below would drop but computes).
    mx = tl.where(mx > float("-inf"), mx, 0.0)
    w = tl.where(m > float("-inf"), tl.exp(m - mx), 0.0)
    total = tl.sum(w * l, axis=0)
    res = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * D + d, res.to(out_ptr.dtype.element_ty))


def target_programs(device: torch.device) -> int:
    """Decode programs that fill ``device``: PROGRAMS_PER_SM per multiprocessor
    on a GPU; 1 elsewhere (Triton's interpreter runs programs one after
    another, so a split only adds the merge)."""
    if device.type != "cuda":
        return 1
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def default_partitions(num_seqs: int, kv_heads: int, programs: int) -> int:
    """Context splits per (sequence, kv head) that fill ``programs`` programs
    (target_programs): the largest power of two <= programs / (num_seqs *
    kv_heads), at least 1.

    P is a constexpr of the kernels, so it depends on the batch size alone
    (not on the block-table width, which an eager step takes from its longest
    context: each width compiled a variant live) and is a power of two, so that
    the decode graphs' buckets (1, 2, 4, 8, 16, ...) compile every value an
    eager step of any size can take. Partitions past a sequence's blocks are
    empty (the merge weighs them 0)."""
    fill = programs // max(1, num_seqs * kv_heads)
    return 1 << (fill.bit_length() - 1) if fill > 1 else 1


def paged_attention_decode(q: torch.Tensor, kv_cache: torch.Tensor, layer: int,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           sm_scale: float | None = None,
                           num_partitions: int | None = None,
                           out: torch.Tensor | None = None,
                           pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """out [S, NH, D] = softmax(q K^T * scale) V over each sequence's cached tokens.

    q: [S, NH, D] (dtype of the cache); kv_cache: kv_cache_view(...);
    block_tables: int32 [S, max_blocks]; context_lens: int32 [S] (0 gives 0).
    num_partitions: context splits per (sequence, kv head); None = fill the GPU
    (default_partitions).
    out: optional [S, NH, D] result buffer (every element is written).
    pdl: which launches take part in PDL (kernels/pdl.py).
    """
    if q.dim() != 3 or kv_cache.dim() != 6:
        raise ValueError("q must be [S, NH, D] and kv_cache [pages, layers, 2, BS, KVH, D]")
    s, nh, dim = q.shape
    pages, layers, two, bs, kvh, kd = kv_cache.shape
    if two != 2 or kd != dim or nh % kvh:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, kv_cache {tuple(kv_cache.shape)}")
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} out of range [0, {layers})")
    if q.dtype != kv_cache.dtype or not q.is_contiguous() or not kv_cache[0].is_contiguous():
        raise ValueError("q and each page of kv_cache must be contiguous, of one dtype")
    if bs < MIN_DOT or bs & (bs - 1) or dim < MIN_DOT or dim & (dim - 1):
        raise ValueError("block_size and head_dim must be powers of two >= 16")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != s:
        raise ValueError("block_tables must be int32 [S, max_blocks]")
    if context_lens.dtype != torch.int32 or context_lens.shape != (s,):
        raise ValueError("context_lens must be int32 [S]")
    block_tables = block_tables.contiguous()
    group = nh // kvh
    if num_partitions is None:
        num_partitions = default_partitions(s, kvh, target_programs(q.device))
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor like q")
    p = num_partitions
    pm = torch.empty(s, nh, p, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    pacc = torch.empty(s, nh, p, dim, dtype=torch.float32, device=q.device)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    _decode_kernel[(s, kvh, p)](
        q, kv_cache, block_tables, context_lens, out, pm, pl, pacc,
        layer, scale, block_tables.shape[1], kv_cache.stride(0), nh, kvh,
        G=group, G_PAD=max(MIN_DOT, triton.next_power_of_2(group)), D=dim, BS=bs, P=p, num_warps=4,
        **pdl_options(q.device, s, pdl),
    )
    if p > 1:
        _decode_merge_kernel[(s * nh,)](pm, pl, pacc, out, P=p, P_PAD=triton.next_power_of_2(p), D=dim,
                                        num_warps=4, **pdl_options(q.device, s, pdl))
    return out


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
            sc = tl.dot(q, tl.trans(k)) * sm_scale
            sc = tl.where((j[None, :] <= i[:, None]) & jmask[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
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
def paged_attention_decode_reference(q, kv_cache, layer, block_tables, context_lens, sm_scale=None):
    s, nh, dim = q.shape
    bs, kvh = kv_cache.shape[3], kv_cache.shape[4]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.zeros(s, nh, dim, dtype=torch.float32, device=q.device)
    for i in range(s):
        n = int(context_lens[i])
        if n == 0:
            continue
        pages = block_tables[i, : -(-n // bs)].long()
        kv = kv_cache[pages, layer].float()  # [blocks, 2, BS, KVH, D]
        k = kv[:, 0].reshape(-1, kvh, dim)[:n].repeat_interleave(nh // kvh, dim=1)
        v = kv[:, 1].reshape(-1, kvh, dim)[:n].repeat_interleave(nh // kvh, dim=1)
        att = torch.einsum("hd,thd->ht", q[i].float(), k) * scale
        out[i] = torch.einsum("ht,thd->hd", att.softmax(-1), v)
    return out


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
