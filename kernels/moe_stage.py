"""Activations staged for the MoE weight kernels, one token row's groups at a time.

The mapping between a group's actual in-group index and the kernels'
virtual K order (weight_layout.virtual_to_actual), the activation planes'
power-of-two scales (weight_layout.plane_scales), the int16 quantization of
the CUDA-core tile (weight_layout.quantize_activations), and `stage_chunk`,
which writes a chunk of groups into the MoePrep buffers. Used by
moe_prepare's launch (kernels/moe_align.py), the fused entry
(kernels/moe_entry.py) and the gate/up kernel (kernels/moe_gate_up.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.moe_decode import tile_k_order
from kernels.moe_tiles import BASE_TOKEN_TILE, NARROW_TOKEN_TILE
from kernels.weight_layout import ACT_QMAX, ACT_SPAN

FP16_MAX = 65504.0
_FP16_MAX_C = tl.constexpr(FP16_MAX)
_QMAX = tl.constexpr(float(ACT_QMAX))
SPAN = tl.constexpr(ACT_SPAN)
# fp32 additions round to integers (half to even) below 2^22 once this is added.
_ROUNDER = tl.constexpr(1.5 * 2.0**23)


@triton.jit
def _virtual_to_actual(v):
    # As weight_layout.virtual_to_actual.
    w = v // 64
    h = (v // 32) % 2
    s = (v // 16) % 2
    ab = (v // 8) % 2
    c = (v // 2) % 4
    e = v % 2
    return 32 * c + 16 * w + 8 * h + 2 * s + ab + 4 * e


@triton.jit
def actual_to_virtual(a):
    # Inverse of _virtual_to_actual: the virtual position of actual in-group
    # index a = 32c + 16w + 8h + 2s + ab + 4e.
    return ((a // 16) % 2) * 64 + ((a // 8) % 2) * 32 + ((a // 2) % 2) * 16 + (a % 2) * 8 + (a // 32) * 2 \
        + (a // 4) % 2


@triton.jit
def plane_scale(v, PLANE: tl.constexpr):
    # 2^-p of virtual position v in activation plane PLANE (fp32), as
    # weight_layout.plane_scales: plane 1 16^-ab, plane 2 2^-(4 ab + 2 (1 - h)).
    ab = (v // 8) % 2
    if PLANE == 1:
        return tl.where(ab == 0, 1.0, 0.0625)
    else:
        h = (v // 32) % 2
        return tl.where(ab == 0, tl.where(h == 0, 0.25, 1.0), tl.where(h == 0, 0.015625, 0.0625))


@triton.jit
def pair_position(a):
    # Where in-group index a sits in the pair order (weight_layout.pair_order).
    return (a // 8) * 8 + 4 * (a % 2) + (a % 8) // 2


@triton.jit
def quantize_spans(xf, NR: tl.constexpr, L: tl.constexpr):
    """fp32 [NR, L] (L a multiple of 64, in K order) -> (int16 [NR, L] q,
    fp32 [NR, L / 64] scales of the spans), as
    weight_layout.quantize_activations (the product and the rounding may
    fuse: q can differ by one)."""
    amax = tl.max(tl.abs(tl.reshape(xf, (NR, L // SPAN, SPAN))), axis=2)  # [NR, L / 64]
    ratio = tl.math.div_rn(tl.full(amax.shape, _QMAX, tl.float32), tl.where(amax > 0, amax, 1.0))
    ratio = tl.where(amax > 0, ratio, 0.0)
    ratio = tl.reshape(tl.broadcast_to(ratio[:, :, None], (NR, L // SPAN, SPAN)), (NR, L))
    q = (xf * ratio + _ROUNDER) - _ROUNDER
    q = tl.minimum(tl.maximum(q, -_QMAX), _QMAX).to(tl.int16)
    return q, tl.math.div_rn(amax, tl.full(amax.shape, _QMAX, tl.float32))


@triton.jit
def stage_chunk(xv, row, gg, gm, v, xp_ptr, xq_scale_ptr, xsum_ptr, out_ptr, T, H,
                GB: tl.constexpr, QUANTIZE: tl.constexpr, ORDER_BM: tl.constexpr):
    """Stages groups gg (int [GB], valid where gm) of token row ``row``: xv
    [GB, 128] holds x at in-group positions v (0..127) of the planes' order
    (K order to quantize; for the fp16 planes the slot order of a ORDER_BM-token
    tile, slot v holding virtual position moe_decode.tile_k_order(v, ORDER_BM):
    load_order gives what to load). Writes the planes (or the int16 plane and
    its span scales), the group sums, and zeroes the same part of the output
    row."""
    n_groups = H // 128
    xv = tl.minimum(tl.maximum(xv.to(tl.float32), -_FP16_MAX_C), _FP16_MAX_C).to(tl.float16)
    dst = row * H + gg[:, None] * 128 + v[None, :]
    tl.store(out_ptr + dst, tl.zeros((GB, 128), tl.float32), mask=gm[:, None])
    tl.store(xsum_ptr + row * n_groups + gg, tl.sum(xv.to(tl.float32), axis=1), mask=gm)
    if QUANTIZE:
        q, scale = quantize_spans(xv.to(tl.float32), GB, 128)
        tl.store(xp_ptr + row * H + gg[:, None] * 128 + pair_position(v)[None, :], q, mask=gm[:, None])
        span = tl.arange(0, 2)
        tl.store(xq_scale_ptr + row * (2 * n_groups) + gg[:, None] * 2 + span[None, :], scale,
                 mask=gm[:, None])
    else:
        tl.store(xp_ptr + dst, xv, mask=gm[:, None])
        # powers of two: exact but for fp16 subnormals
        vpos = tile_k_order(v, ORDER_BM)
        x1 = (xv.to(tl.float32) * plane_scale(vpos, 1)[None, :]).to(tl.float16)
        tl.store(xp_ptr + T * H + dst, x1, mask=gm[:, None])
        x2 = (xv.to(tl.float32) * plane_scale(vpos, 2)[None, :]).to(tl.float16)
        tl.store(xp_ptr + 2 * T * H + dst, x2, mask=gm[:, None])


@triton.jit
def load_order(v, QUANTIZE: tl.constexpr, ORDER_BM: tl.constexpr):
    """The actual in-group index that stage_chunk's position v takes: v
    itself to quantize (K order), else that of the slot's virtual position."""
    if QUANTIZE:
        return v
    else:
        return _virtual_to_actual(tile_k_order(v, ORDER_BM))


def order_tile(narrow: bool) -> int:
    """ORDER_BM of the staging launches for MoePrep.narrow_order."""
    return NARROW_TOKEN_TILE if narrow else BASE_TOKEN_TILE
