"""Rotary position embedding ("rotate half") on queries and keys, one launch.

The torch version is ~15 launches per layer (angles, cat, cos, sin, casts,
two rotate-halves, multiplies, adds). Here one program per token computes
the angles position * inv_freq in float32, and rotates every query and key
head of that token.

Numerics follow transformers' order (rotary_reference, the CPU path): cos and sin
are rounded to the activation dtype, and each product and the sum are rounded
to it as torch's elementwise ops on that dtype do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rotary_cos_sin(pos_ptr, inv_freq_ptr, row, dt, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """cos, sin [1, BLOCK_HALF] in dtype dt of token `row`'s angles
    position * inv_freq (float32, then rounded to dt as transformers does).
    Both loads go through the L2 (.cg), so that a launch may issue them
    before its PDL wait (kernels/pdl.py; rotary_cache_write does)."""
    i = tl.arange(0, BLOCK_HALF)
    pos = tl.load(pos_ptr + row, cache_modifier=".cg").to(tl.float32)
    freq = tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0, cache_modifier=".cg")
    angle = (pos * freq)[None, :]  # [1, BLOCK_HALF]
    return tl.cos(angle).to(dt), tl.sin(angle).to(dt)


@triton.jit
def rotate_heads(src_row, dst_row, h0, n_heads, cos, sin,
                 HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Heads [h0, h0 + BLOCK_HEADS) (those < n_heads) of one token, rotated.

    src_row, dst_row: pointers to the token's heads [n_heads, 2 * HALF]
    (contiguous heads); cos, sin: [1, BLOCK_HALF] in dst's dtype.
    """
    h = h0 + tl.arange(0, BLOCK_HEADS)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < n_heads) & (i < HALF)
    at = h * (2 * HALF) + i
    x1 = tl.load(src_row + at, mask=mask, other=0.0)
    x2 = tl.load(src_row + at + HALF, mask=mask, other=0.0)
    dt = dst_row.dtype.element_ty
    c = cos.to(tl.float32)
    s = sin.to(tl.float32)
    a1 = (x1.to(tl.float32) * c).to(dt).to(tl.float32)
    b1 = -(x2.to(tl.float32) * s).to(dt).to(tl.float32)
    a2 = (x2.to(tl.float32) * c).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * s).to(dt).to(tl.float32)
    tl.store(dst_row + at, (a1 + b1).to(dt), mask=mask)
    tl.store(dst_row + at + HALF, (a2 + b2).to(dt), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr,  # [T] int64 positions
    inv_freq_ptr,  # [HALF] float32
    q_ptr, k_ptr,  # [T, q_heads, D], [T, k_heads, D] (row strides stride_q, stride_k)
    qo_ptr, ko_ptr,  # contiguous outputs
    q_heads, k_heads, stride_q, stride_k,
    HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cos, sin = rotary_cos_sin(pos_ptr, inv_freq_ptr, row, qo_ptr.dtype.element_ty, HALF, BLOCK_HALF)
    rotate_heads(q_ptr + row * stride_q, qo_ptr + row * (q_heads * 2 * HALF), 0, q_heads, cos, sin,
                 HALF, BLOCK_QH, BLOCK_HALF)
    rotate_heads(k_ptr + row * stride_k, ko_ptr + row * (k_heads * 2 * HALF), 0, k_heads, cos, sin,
                 HALF, BLOCK_KH, BLOCK_HALF)


def check_qk(x: torch.Tensor, name: str) -> None:
    if x.dim() != 3 or x.shape[2] % 2 or x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError(f"{name} must be [T, heads, even head_dim] with contiguous heads, got {tuple(x.shape)}")


def apply_rotary(positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k), new contiguous tensors of the same shapes and dtype.

    positions: [T] int; inv_freq: [head_dim / 2] float32; q: [T, hq, D];
    k: [T, hk, D] (row strides may differ from hq * D, e.g. views of a fused
    projection).
    """
    check_qk(q, "q")
    check_qk(k, "k")
    t, hq, d = q.shape
    if k.shape[0] != t or k.shape[2] != d or positions.shape != (t,) or inv_freq.shape != (d // 2,):
        raise ValueError("positions [T], inv_freq [D/2], q [T, hq, D] and k [T, hk, D] must agree")
    if not (positions.device == inv_freq.device == q.device == k.device) or q.dtype != k.dtype:
        raise ValueError("positions, inv_freq, q and k must share a device; q and k a dtype")
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t:
        half = d // 2
        _rotary_kernel[(t,)](positions, inv_freq.float(), q, k, qo, ko, hq, k.shape[1], q.stride(0), k.stride(0),
                             HALF=half, BLOCK_QH=triton.next_power_of_2(hq),
                             BLOCK_KH=triton.next_power_of_2(k.shape[1]),
                             BLOCK_HALF=triton.next_power_of_2(half))
    return qo, ko


def rotary_reference(positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor,
                     k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch in transformers' order (also the CPU path of the model)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    angles = torch.cat((freqs, freqs), dim=-1)
    cos = angles.cos().to(q.dtype)[:, None, :]
    sin = angles.sin().to(q.dtype)[:, None, :]

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
