"""Rotary embedding of a decode step's queries and keys with the keys and
values stored straight into the paged KV arena, one launch.

A decode step used three: rotate q and k (kernels/rotary.py, one program
per token), store k and v (kernels/paged_attention.py write_kv_cache), then
attend. At batch 1 on the H200 the first two took 3.7 + 1.3 us per layer, most
of it latency (one program did all 32 + 8 heads of the token). Here the
programs of one token split its heads: q heads, k heads (rotated and stored
at the token's KV slot) and v heads (stored), HEADS_PER_PROGRAM at a time,
and the rotated k never makes a round trip through memory.

The rotation is kernels/rotary.py's (same helpers, same rounding); the
stores follow write_kv_cache (slot = page * block_size + offset, < 0 skips
the token).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.rotary import check_qk, rotary_cos_sin, rotary_reference, rotate_heads

# Heads per program: Mixtral (32 q, 8 kv heads of 128) gives 6 programs per
# token, each moving 2 KiB.
HEADS_PER_PROGRAM = 8


@triton.jit
def _copy_heads(src_row, dst_row, h0, n_heads, D: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                BLOCK_D: tl.constexpr):
    # Heads [h0, h0 + BLOCK_HEADS) of one token: src_row -> dst_row, both [n_heads, D].
    h = h0 + tl.arange(0, BLOCK_HEADS)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < D)
    tl.store(dst_row + h * D + d, tl.load(src_row + h * D + d, mask=mask), mask=mask)


@triton.jit
def _rotary_cache_write_kernel(
    pos_ptr,  # [T] int64 positions
    inv_freq_ptr,  # [HALF] float32
    q_ptr, k_ptr, v_ptr,  # [T, q_heads, D], [T, kv_heads, D] x 2 (row strides stride_q, stride_k, stride_v)
    qo_ptr,  # [T, q_heads, D] contiguous out: rotated q
    kv_ptr,  # [pages, layers, 2, BS, kv_heads, D] the arena's KV view (page stride page_stride)
    slot_ptr,  # [T] int64 slot = page * BS + offset, < 0 = skip
    q_heads, kv_heads, stride_q, stride_k, stride_v, layer, page_stride,
    HALF: tl.constexpr, BS: tl.constexpr, HB: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr,
):
    # Program (token, j): head block j of [q heads | k heads | v heads], HB
    # heads per block, each kind starting a new block.
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    q_blocks = tl.cdiv(q_heads, HB)
    kv_blocks = tl.cdiv(kv_heads, HB)
    dt = qo_ptr.dtype.element_ty
    # The position, its angles and the slot come from the step's inputs,
    # which no launch of the step writes: loaded and computed before the
    # PDL wait (kernels/pdl.py), off the chain that starts at it.
    cos, sin = rotary_cos_sin(pos_ptr, inv_freq_ptr, row, dt, HALF, BLOCK_HALF)
    slot = tl.load(slot_ptr + row, cache_modifier=".cg")
    wait_for_previous_grid(PDL)
    if j < q_blocks:
        rotate_heads(q_ptr + row * stride_q, qo_ptr + row * (q_heads * 2 * HALF), j * HB, q_heads, cos, sin,
                     HALF, HB, BLOCK_HALF)
    else:
        if slot >= 0:
            token_elems = kv_heads * 2 * HALF  # elements of one token's k (or v) in a page
            k_row = kv_ptr + (slot // BS) * page_stride + layer * (2 * BS * token_elems) + (slot % BS) * token_elems
            if j < q_blocks + kv_blocks:
                rotate_heads(k_ptr + row * stride_k, k_row, (j - q_blocks) * HB, kv_heads, cos, sin,
                             HALF, HB, BLOCK_HALF)
            else:
                _copy_heads(v_ptr + row * stride_v, k_row + BS * token_elems, (j - q_blocks - kv_blocks) * HB,
                            kv_heads, 2 * HALF, HB, 2 * BLOCK_HALF)


def check_rotary_cache_inputs(positions, inv_freq, q, k, v, kv_cache, layer, slot_mapping) -> None:
    """ValueError unless the arguments are as rotary_cache_write takes them
    (also kernels/qkv_rotary_gemv.py's checks)."""
    check_qk(q, "q")
    check_qk(k, "k")
    check_qk(v, "v")
    t, _, d = q.shape
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"k and v must be [T, kv_heads, D] like q's T and D, got {tuple(k.shape)}, {tuple(v.shape)}")
    if positions.shape != (t,) or inv_freq.shape != (d // 2,) or slot_mapping.shape != (t,):
        raise ValueError("positions and slot_mapping must be [T], inv_freq [D / 2]")
    if kv_cache.dim() != 6 or kv_cache.shape[2] != 2 or kv_cache.shape[4:] != k.shape[1:]:
        raise ValueError(f"kv_cache must be [pages, layers, 2, block_size, {k.shape[1]}, {d}], "
                         f"got {tuple(kv_cache.shape)}")
    if not kv_cache[0].is_contiguous():
        raise ValueError("each page of kv_cache must be contiguous")
    if not 0 <= layer < kv_cache.shape[1]:
        raise ValueError(f"layer {layer} out of range [0, {kv_cache.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype == kv_cache.dtype):
        raise ValueError("q, k, v and the cache must share a dtype")
    if slot_mapping.dtype != torch.int64:
        raise ValueError("slot_mapping must be int64")
    tensors = (positions, inv_freq, q, k, v, kv_cache, slot_mapping)
    if len({x.device for x in tensors}) != 1:
        raise ValueError("all tensors must be on one device")


def rotary_cache_write(positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor,
                       pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """Rotated q [T, q_heads, D] (new, contiguous); rotated k and v stored at
    each token's slot of `layer` in kv_cache.

    positions: [T] int; inv_freq: [D / 2] float32; q: [T, q_heads, D]; k, v:
    [T, kv_heads, D] (row strides may differ, e.g. views of a fused
    projection; heads contiguous); kv_cache: [pages, layers, 2, block_size,
    kv_heads, D] (paged_attention.kv_cache_view); slot_mapping: int64 [T],
    < 0 = the token is not stored; pdl: kernels/pdl.py.
    """
    check_rotary_cache_inputs(positions, inv_freq, q, k, v, kv_cache, layer, slot_mapping)
    t, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if t:
        programs = triton.cdiv(hq, HEADS_PER_PROGRAM) + 2 * triton.cdiv(hk, HEADS_PER_PROGRAM)
        _rotary_cache_write_kernel[(t, programs)](
            positions, inv_freq.float(), q, k, v, qo, kv_cache, slot_mapping,
            hq, hk, q.stride(0), k.stride(0), v.stride(0), layer, kv_cache.stride(0),
            HALF=d // 2, BS=kv_cache.shape[3], HB=HEADS_PER_PROGRAM, BLOCK_HALF=triton.next_power_of_2(d // 2),
            **pdl_options(q.device, t, pdl),
        )
    return qo


def rotary_cache_write_reference(positions, inv_freq, q, k, v, kv_cache, layer, slot_mapping) -> torch.Tensor:
    """Plain torch: rotary_reference, then the stores of write_kv_cache."""
    qo, ko = rotary_reference(positions, inv_freq, q, k)
    bs = kv_cache.shape[3]
    keep = slot_mapping >= 0
    pages, offsets = slot_mapping[keep] // bs, slot_mapping[keep] % bs
    kv_cache[pages, layer, 0, offsets] = ko[keep]
    kv_cache[pages, layer, 1, offsets] = v[keep]
    return qo
