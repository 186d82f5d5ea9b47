"""Quantize and pack one block W [N, K] into the five fields of WEIGHT_LAYOUT.md.

One program per (16 rows, group of 128): min/max of each row's group, the
8-bit code q, every field's packed int32 words and every view's (scale,
offset) fp16 pair. The output is the five fields' byte strings, contiguous,
ready to be copied into arena pages (loading) or staged for promotions.

Numerics match kernels/weight_layout.py: IEEE division, round half to even,
midpoint scales by default. least_squares=True refits each view's (scale,
offset) to the group's weights for the view's fixed codes, as the weight
store's codec does by default (dataplane/weights/codec.py, ScaleFit.LSQ):
the sums run in another order, so a pair may differ from the codec's by an
fp16 rounding step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.weight_layout import GROUP, NUM_FIELDS, TILE_ROWS, field_bytes, field_code_bytes, pack_block

ROWS_PER_PROGRAM = 16
_TILE_ROWS = tl.constexpr(TILE_ROWS)
_ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + M - M rounds half to even


@triton.jit
def _quarter_word(vals, LSB: tl.constexpr, WIDTH: tl.constexpr, WORD: tl.constexpr):
    # vals: int32 [BR, 4, 32] field values of each quarter -> int32 [BR, 4]:
    # word WORD of each quarter. Bit t of weight i = 8m + j lies at
    # 4j + LSB + t - r (mod 32), r = 2 (m % 2) + m // 2, in word m // 2 of a
    # 2-bit field (weight_layout.quarter_bit_positions).
    i = tl.arange(0, 32)[None, None, :]
    m = i // 8
    r = 2 * (m % 2) + m // 2
    if WIDTH == 2:
        mine = (m // 2) == WORD
    else:
        mine = i >= 0
    word = tl.zeros((vals.shape[0], vals.shape[1]), tl.int32)
    for t in tl.static_range(WIDTH):
        bit = (4 * (i % 8) + LSB + t - r + 32) % 32
        word += tl.sum(tl.where(mine, ((vals >> t) & 1) << bit, 0), axis=2)  # disjoint bits: sum == OR
    return word


@triton.jit
def _pack_field(q, SHIFT: tl.constexpr, WIDTH: tl.constexpr, LSB: tl.constexpr, BR: tl.constexpr):
    # q: int32 [BR, 128] codes -> int32 [BR, 128 * WIDTH / 32] words of one field (v4 in-word order).
    vals = tl.reshape((q >> SHIFT) & ((1 << WIDTH) - 1), (BR, 4, 32))
    if WIDTH == 2:
        words = tl.join(_quarter_word(vals, LSB, 2, 0), _quarter_word(vals, LSB, 2, 1))  # [BR, 4, 2]
        return tl.reshape(words, (BR, 8))
    else:
        return _quarter_word(vals, LSB, 1, 0)


@triton.jit
def _view_pair(w, q, lo, s, STEP: tl.constexpr, LSQ: tl.constexpr):
    # fp32 [BR] (scale, offset) of the view whose codes are q // STEP (STEP 8-bit codes per code).
    mid = s * STEP
    if LSQ:
        # least squares for the fixed codes t: min ||w - offset - scale * t|| per row
        t = (q // STEP).to(tl.float32)  # [BR, 128]
        t_mean = tl.sum(t, axis=1) / 128.0
        w_mean = tl.sum(w, axis=1) / 128.0
        t_c = t - t_mean[:, None]
        var = tl.sum(t_c * t_c, axis=1)
        cov = tl.sum(t_c * (w - w_mean[:, None]), axis=1)
        flat = var == 0.0
        scale = tl.where(flat, mid, tl.div_rn(cov, tl.where(flat, 1.0, var)))
        scale = scale.to(tl.float16).to(tl.float32)  # stored in fp16: the offset fits the rounded scale
        return scale, w_mean - scale * t_mean
    else:
        return mid, lo + s * (STEP - 1.0) / 2.0


@triton.jit
def _store_view(out_ptr, code_off, scale_off, words, w, q, lo, s, r, gi, G, rmask,
                WORDS: tl.constexpr, STEP: tl.constexpr, LSQ: tl.constexpr):
    # words: int32 [BR, WORDS] of this field; lo, s: fp32 [BR]. Item (row r,
    # group gi) sits at tile-major index ((r // 64) * G + gi) * 64 + r % 64.
    j = tl.arange(0, WORDS)
    item = ((r // _TILE_ROWS) * G + gi) * _TILE_ROWS + r % _TILE_ROWS
    tl.store(out_ptr + code_off + item[:, None] * WORDS + j[None, :], words, mask=rmask[:, None])
    scale, offset = _view_pair(w, q, lo, s, STEP, LSQ)
    scale = scale.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    offset = offset.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    tl.store(out_ptr + scale_off + item, scale | (offset << 16), mask=rmask)


@triton.jit
def _quant_pack_kernel(
    w_ptr,  # [N, K] float, row stride stride_w
    out_ptr,  # [total_words] int32: per field, codes then (scale, offset) pairs
    N, K, stride_w,
    c0, s0, c1, s1, c2, s2, c3, s3, c4, s4,  # word offsets of each field's codes / scales
    BR: tl.constexpr, LSQ: tl.constexpr,
):
    pid_r = tl.program_id(0)
    gi = tl.program_id(1)
    G = K // 128
    r = pid_r * BR + tl.arange(0, BR)
    rmask = r < N
    k = gi * 128 + tl.arange(0, 128)
    w = tl.load(w_ptr + r[:, None].to(tl.int64) * stride_w + k[None, :], mask=rmask[:, None],
                other=0.0).to(tl.float32)
    lo = tl.min(w, axis=1)
    hi = tl.max(w, axis=1)
    s = tl.div_rn(hi - lo, 255.0)
    s = tl.where(hi == lo, 1.0, s)
    t = tl.div_rn(w - lo[:, None], s[:, None])
    t = (t + _ROUND_MAGIC) - _ROUND_MAGIC
    q = tl.minimum(tl.maximum(t, 0.0), 255.0).to(tl.int32)
    # (field shift, width, nibble lsb) of fields 0..4 (weight_layout); view f
    # has 2, 3, 4, 6, 8 bits: STEP = 2^(8 - bits) 8-bit codes per code
    _store_view(out_ptr, c0, s0, _pack_field(q, 6, 2, 2, BR), w, q, lo, s, r, gi, G, rmask, 8, 64, LSQ)
    _store_view(out_ptr, c1, s1, _pack_field(q, 5, 1, 1, BR), w, q, lo, s, r, gi, G, rmask, 4, 32, LSQ)
    _store_view(out_ptr, c2, s2, _pack_field(q, 4, 1, 0, BR), w, q, lo, s, r, gi, G, rmask, 4, 16, LSQ)
    _store_view(out_ptr, c3, s3, _pack_field(q, 2, 2, 2, BR), w, q, lo, s, r, gi, G, rmask, 8, 4, LSQ)
    _store_view(out_ptr, c4, s4, _pack_field(q, 0, 2, 0, BR), w, q, lo, s, r, gi, G, rmask, 8, 1, LSQ)


def quant_pack(w: torch.Tensor, least_squares: bool = False) -> list[torch.Tensor]:
    """The five fields' byte strings (uint8 1-D, views of one buffer) of W [N, K].

    least_squares: each view's (scale, offset) refit by least squares (the
    module docstring); False: midpoint scales."""
    if w.dim() != 2:
        raise ValueError(f"W must be [N, K], got {tuple(w.shape)}")
    if w.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"W must be fp16/bf16/fp32, got {w.dtype}")
    n, k = w.shape
    if k % GROUP or n == 0:
        raise ValueError(f"K must be a positive multiple of {GROUP} and N > 0, got {n} x {k}")
    if w.stride(1) != 1:
        raise ValueError("W must be contiguous along K")
    sizes = [field_bytes(f, n, k) // 4 for f in range(NUM_FIELDS)]
    # Zeroed: the rows that pad the last tile are never written.
    out = torch.zeros(sum(sizes), dtype=torch.int32, device=w.device)
    offs, start = [], 0
    for f, size in enumerate(sizes):
        code_words = field_code_bytes(f, n, k) // 4
        offs += [start, start + code_words]
        start += size
    grid = (triton.cdiv(n, ROWS_PER_PROGRAM), k // GROUP)
    _quant_pack_kernel[grid](w, out, n, k, w.stride(0), *offs, BR=ROWS_PER_PROGRAM, LSQ=least_squares, num_warps=4)
    fields, start = [], 0
    for size in sizes:
        fields.append(out[start : start + size].view(torch.uint8))
        start += size
    return fields


def quant_pack_reference(w: torch.Tensor) -> list[torch.Tensor]:
    """Plain-torch reference (kernels/weight_layout.pack_block)."""
    return pack_block(w)
