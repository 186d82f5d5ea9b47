"""Decode attention over the paged KV arena: one query token per sequence,
grouped-query, the context split into partitions (flash-decoding).

A program takes one (sequence, kv head, context partition) and all query
heads of that kv head, so each K/V block is read once for the whole group.
The cache is kernels/paged_attention.kv_cache_view's [pages, layers, 2,
block_size, kv_heads, head_dim]; a sequence's pages are its block-table row
(int32 [seqs, max_blocks]); context_lens (int32 [seqs]) says how many tokens
are valid.

Two fusions, each optional, both for the decode step at small batches where
a launch is mostly latency (B=1 on the H200: the partition merge 1.6 us and
rotary + KV write 2.25 us of a ~118 us Mixtral layer,
benchmarks/results/e2e_h200_s20_b1_profile.json):

* the merge: given zeroed arrival counters (kernels/arrival_counters.py), the
  last program of each (sequence, kv head) to finish merges the partitions
  in the same launch; otherwise a second launch does.
* rotary + KV write (DecodeRotary): q, k, v are the step's unrotated
  projections; every program rotates its query heads, and the program whose
  partition holds the sequence's last block rotates the new token's key,
  stores key and value at the token's slot and attends to them from its
  registers (the stored copy is for later steps). Contract: the new token is
  the sequence's last, at position context_len - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.paged_attention import MIN_DOT, online_softmax_step
from kernels.pdl import pdl_options, wait_for_previous_grid
from kernels.rotary import check_qk, rotary_reference

# Partitions the in-launch merge reads per load: [heads, MERGE_CHUNK, D] fp32
# (Mixtral: 4 x 16 x 128 = 64 registers a thread at 4 warps).
MERGE_CHUNK = 16
TARGET_PROGRAMS = 264  # about two programs per multiprocessor on an H200


@dataclass(frozen=True)
class DecodeRotary:
    """The step's unrotated keys and values and where they go: positions
    [S] int, inv_freq [D / 2] float32, k, v [S, KVH, D] (heads contiguous,
    any row stride), slot_mapping [S] int64 (< 0: not stored)."""

    positions: torch.Tensor
    inv_freq: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor


@triton.jit
def _rotate(x, partner, cos, sin, sign, dt):
    # Rotate-half in kernels/rotary.py's rounding: each product rounded to dt,
    # then their sum. partner: x's other half (index d + D/2 mod D), sign -1
    # on the first half.
    a = (x.to(tl.float32) * cos).to(dt).to(tl.float32)
    b = (partner.to(tl.float32) * sin).to(dt).to(tl.float32)
    return (a + sign * b).to(dt)


@triton.jit
def _decode_kernel(
    q_ptr,  # [S, NH, D] (row stride stride_q)
    kv_ptr,  # [pages, layers, 2, BS, KVH, D]
    bt_ptr,  # [S, max_blocks] int32
    ctx_ptr,  # [S] int32
    out_ptr,  # [S, NH, D] contiguous
    pm_ptr,  # [S, NH, P] fp32 partition running max (P > 1)
    pl_ptr,  # [S, NH, P] fp32 partition sum of exp
    pacc_ptr,  # [S, NH, P, D] fp32 partition numerator
    count_ptr,  # [S * KVH] int32 arrival counters, zero on entry and exit (MERGE_IN)
    pos_ptr, inv_freq_ptr,  # [S] int, [D / 2] fp32 (ROTARY)
    k_ptr, v_ptr,  # [S, KVH, D] unrotated key, value (row strides stride_k, stride_v; ROTARY)
    slot_ptr,  # [S] int64 the new token's slot, < 0 = not stored (ROTARY)
    layer, sm_scale, max_blocks, page_stride, NH, KVH, stride_q, stride_k, stride_v,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, P: tl.constexpr,
    MERGE_IN: tl.constexpr, G_MERGE: tl.constexpr, P_CHUNK: tl.constexpr, ROTARY: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_grid(PDL)
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    ctx = tl.load(ctx_ptr + s)
    n_blocks = tl.cdiv(ctx, BS)
    per_part = tl.cdiv(n_blocks, P)
    b0 = part * per_part
    b1 = tl.minimum(b0 + per_part, n_blocks)
    gi = tl.arange(0, G_PAD)
    heads = kvh * G + gi
    hmask = gi < G
    d = tl.arange(0, D)
    t = tl.arange(0, BS)
    q_row = q_ptr + s.to(tl.int64) * stride_q
    q = tl.load(q_row + heads[:, None] * D + d[None, :], mask=hmask[:, None], other=0.0)  # [G_PAD, D]
    layer_off = layer * (2 * BS * KVH * D)
    if ROTARY:
        dt = q_ptr.dtype.element_ty
        half = D // 2
        partner = (d + half) % D
        angle = tl.load(pos_ptr + s).to(tl.float32) * tl.load(inv_freq_ptr + d % half)  # [D]
        cos = tl.cos(angle).to(dt).to(tl.float32)
        sin = tl.sin(angle).to(dt).to(tl.float32)
        sign = tl.where(d < half, -1.0, 1.0)
        q_partner = tl.load(q_row + heads[:, None] * D + partner[None, :], mask=hmask[:, None], other=0.0)
        q = _rotate(q, q_partner, cos[None, :], sin[None, :], sign[None, :], dt)
        k_row = k_ptr + s.to(tl.int64) * stride_k + kvh * D
        k_new = _rotate(tl.load(k_row + d), tl.load(k_row + partner), cos, sin, sign, dt)  # [D]
        v_new = tl.load(v_ptr + s.to(tl.int64) * stride_v + kvh * D + d)  # [D]
        slot = tl.load(slot_ptr + s)
        if (b0 < b1) & (b1 == n_blocks) & (slot >= 0):
            # This program holds the last block: the token's stored copy.
            dst = kv_ptr + (slot // BS) * page_stride + layer_off + (slot % BS) * (KVH * D) + kvh * D + d
            tl.store(dst, k_new)
            tl.store(dst + BS * KVH * D, v_new)
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    tok_off = t[:, None] * (KVH * D) + kvh * D + d[None, :]  # [BS, D]
    for b in range(b0, b1):
        page = tl.load(bt_ptr + s.to(tl.int64) * max_blocks + b).to(tl.int64)
        base = kv_ptr + page * page_stride + layer_off
        # Slots past the context hold stale bytes (a page freed by a demoted
        # expert block, say) that may read as NaN: never load them (0 * NaN = NaN).
        live = b * BS + t < ctx  # [BS]
        k = tl.load(base + tok_off, mask=live[:, None], other=0.0)  # [BS, D]
        v = tl.load(base + BS * KVH * D + tok_off, mask=live[:, None], other=0.0)
        if ROTARY:
            # The new token from registers: its slot may be read before
            # (or while) this program's store lands.
            new = (b * BS + t == ctx - 1)[:, None]
            k = tl.where(new, k_new[None, :], k)
            v = tl.where(new, v_new[None, :], v)
        m_i, l_i, acc = online_softmax_step(q, k, v, live[None, :], sm_scale, m_i, l_i, acc)  # [G_PAD, ...]
    row = s * NH + heads
    if P == 1:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + row[:, None].to(tl.int64) * D + d[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=hmask[:, None])
    else:
        tl.store(pm_ptr + row * P + part, m_i, mask=hmask)
        tl.store(pl_ptr + row * P + part, l_i, mask=hmask)
        tl.store(pacc_ptr + (row[:, None] * P + part).to(tl.int64) * D + d[None, :], acc, mask=hmask[:, None])
        if MERGE_IN:
            # Every thread's stores before the one thread's release; the last
            # of the P programs merges and hands the counter back zeroed.
            tl.debug_barrier()
            count = count_ptr + s * KVH + kvh
            if tl.atomic_add(count, 1, sem="acq_rel") == P - 1:
                _merge_partitions(pm_ptr, pl_ptr, pacc_ptr, out_ptr, s * NH + kvh * G, G, P, D, G_MERGE, P_CHUNK)
                tl.atomic_xchg(count, 0)


@triton.jit
def _merge_partitions(pm_ptr, pl_ptr, pacc_ptr, out_ptr, row0, G: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
                      G_MERGE: tl.constexpr, P_CHUNK: tl.constexpr):
    # Rows [row0, row0 + G) of out from their P partitions, P_CHUNK at a time
    # with a running max (the merge launch's arithmetic). The partitions were
    # written by other programs: loads bypass L1 (.cg).
    gi = tl.arange(0, G_MERGE)
    rows = (row0 + gi).to(tl.int64)
    rmask = gi < G
    d = tl.arange(0, D)
    pc = tl.arange(0, P_CHUNK)
    mx = tl.full((G_MERGE,), float("-inf"), tl.float32)
    total = tl.zeros((G_MERGE,), tl.float32)
    num = tl.zeros((G_MERGE, D), tl.float32)
    for p0 in range(0, P, P_CHUNK):
        pi = p0 + pc
        mask = rmask[:, None] & (pi < P)[None, :]  # [G_MERGE, P_CHUNK]
        m = tl.load(pm_ptr + rows[:, None] * P + pi[None, :], mask=mask, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(pl_ptr + rows[:, None] * P + pi[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        acc = tl.load(pacc_ptr + (rows[:, None, None] * P + pi[None, :, None]) * D + d[None, None, :],
                      mask=mask[:, :, None], other=0.0, cache_modifier=".cg")  # [G_MERGE, P_CHUNK, D]
        mx_new = tl.maximum(mx, tl.max(m, axis=1))
        # Rows whose partitions so far are all empty keep -inf: scale by 0, not NaN.
        keep = tl.where(mx > float("-inf"), tl.exp(mx - mx_new), 0.0)
        w = tl.where(m > float("-inf"), tl.exp(m - mx_new[:, None]), 0.0)  # [G_MERGE, P_CHUNK]
        total = total * keep + tl.sum(w * l, axis=1)
        num = num * keep[:, None] + tl.sum(w[:, :, None] * acc, axis=1)
        mx = mx_new
    res = num / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + rows[:, None] * D + d[None, :], res.to(out_ptr.dtype.element_ty), mask=rmask[:, None])


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
    w = tl.where(m > float("-inf"), tl.exp(m - mx), 0.0)
    total = tl.sum(w * l, axis=0)
    res = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * D + d, res.to(out_ptr.dtype.element_ty))


def _check_rotary(rotary: DecodeRotary, q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    s, _, dim = q.shape
    check_qk(rotary.k, "k")
    check_qk(rotary.v, "v")
    if rotary.k.shape != (s, kv_cache.shape[4], dim) or rotary.v.shape != rotary.k.shape:
        raise ValueError(f"rotary k and v must be [{s}, {kv_cache.shape[4]}, {dim}], got "
                         f"{tuple(rotary.k.shape)} and {tuple(rotary.v.shape)}")
    if rotary.positions.shape != (s,) or rotary.slot_mapping.shape != (s,) or rotary.inv_freq.shape != (dim // 2,):
        raise ValueError("rotary positions and slot_mapping must be [S], inv_freq [D / 2]")
    if rotary.slot_mapping.dtype != torch.int64 or rotary.k.dtype != q.dtype or rotary.v.dtype != q.dtype:
        raise ValueError("rotary slot_mapping must be int64, k and v of q's dtype")
    tensors = (rotary.positions, rotary.inv_freq, rotary.k, rotary.v, rotary.slot_mapping)
    if any(x.device != q.device for x in tensors):
        raise ValueError("rotary tensors must be on q's device")


def paged_attention_decode(q: torch.Tensor, kv_cache: torch.Tensor, layer: int,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           sm_scale: float | None = None,
                           num_partitions: int | None = None,
                           out: torch.Tensor | None = None,
                           counters: torch.Tensor | None = None,
                           rotary: DecodeRotary | None = None) -> torch.Tensor:
    """out [S, NH, D] = softmax(q K^T * scale) V over each sequence's cached tokens.

    q: [S, NH, D] (dtype of the cache; heads contiguous, any row stride);
    kv_cache: kv_cache_view(...); block_tables: int32 [S, max_blocks];
    context_lens: int32 [S] (0 gives 0). num_partitions: context splits per
    (sequence, kv head); None = fill the GPU. out: optional contiguous [S,
    NH, D] result buffer (every element is written). counters: optional
    zeroed int32 [>= S * KV heads] on q's device, left zeroed: partitions
    merged in the same launch; None: by a second launch. rotary: q and the
    given k, v are unrotated; the kernel rotates them and stores k, v (module
    docstring); None: q is rotated and the cache holds the step's tokens.
    """
    if q.dim() != 3 or kv_cache.dim() != 6:
        raise ValueError("q must be [S, NH, D] and kv_cache [pages, layers, 2, BS, KVH, D]")
    s, nh, dim = q.shape
    pages, layers, two, bs, kvh, kd = kv_cache.shape
    if two != 2 or kd != dim or nh % kvh:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, kv_cache {tuple(kv_cache.shape)}")
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} out of range [0, {layers})")
    if q.dtype != kv_cache.dtype or q.stride(2) != 1 or q.stride(1) != dim or not kv_cache[0].is_contiguous():
        raise ValueError("q (heads contiguous) and each page of kv_cache (contiguous) must share a dtype")
    if bs < MIN_DOT or bs & (bs - 1) or dim < MIN_DOT or dim & (dim - 1):
        raise ValueError("block_size and head_dim must be powers of two >= 16")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != s:
        raise ValueError("block_tables must be int32 [S, max_blocks]")
    if context_lens.dtype != torch.int32 or context_lens.shape != (s,):
        raise ValueError("context_lens must be int32 [S]")
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() < s * kvh
                                 or counters.device != q.device or not counters.is_contiguous()):
        raise ValueError(f"counters must be contiguous int32 with >= {s * kvh} elements on q's device")
    if rotary is not None:
        _check_rotary(rotary, q, kv_cache)
    block_tables = block_tables.contiguous()
    group = nh // kvh
    if num_partitions is None:
        num_partitions = max(1, min(block_tables.shape[1], TARGET_PROGRAMS // max(1, s * kvh)))
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor like q")
    p = num_partitions
    merge_in = counters is not None and p > 1
    pm = torch.empty(s, nh, p, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    pacc = torch.empty(s, nh, p, dim, dtype=torch.float32, device=q.device)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    # Without rotary its pointers are never read: q stands in.
    r = rotary or DecodeRotary(context_lens, pm, q, q, context_lens)
    _decode_kernel[(s, kvh, p)](
        q, kv_cache, block_tables, context_lens, out, pm, pl, pacc, counters if merge_in else pm,
        r.positions, r.inv_freq, r.k, r.v, r.slot_mapping,
        layer, scale, block_tables.shape[1], kv_cache.stride(0), nh, kvh, q.stride(0), r.k.stride(0), r.v.stride(0),
        G=group, G_PAD=max(MIN_DOT, triton.next_power_of_2(group)), D=dim, BS=bs, P=p,
        MERGE_IN=merge_in, G_MERGE=triton.next_power_of_2(group), P_CHUNK=min(MERGE_CHUNK, triton.next_power_of_2(p)),
        ROTARY=rotary is not None, num_warps=4, **pdl_options(q.device, s),
    )
    if p > 1 and not merge_in:
        _decode_merge_kernel[(s * nh,)](pm, pl, pacc, out, P=p, P_PAD=triton.next_power_of_2(p), D=dim,
                                        num_warps=4, **pdl_options(q.device, s))
    return out


# -- plain-torch reference ------------------------------------------------------
def paged_attention_decode_reference(q, kv_cache, layer, block_tables, context_lens, sm_scale=None,
                                     rotary: DecodeRotary | None = None):
    """fp32 [S, NH, D]. With rotary: rotates q and k (kernels/rotary.py's
    reference) and stores k, v at their slots of kv_cache first (in place)."""
    if rotary is not None:
        q, k = rotary_reference(rotary.positions, rotary.inv_freq, q, rotary.k)
        bs, keep = kv_cache.shape[3], rotary.slot_mapping >= 0
        pages, offsets = rotary.slot_mapping[keep] // bs, rotary.slot_mapping[keep] % bs
        kv_cache[pages, layer, 0, offsets] = k[keep]
        kv_cache[pages, layer, 1, offsets] = rotary.v[keep]
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
