"""Triton device function: the per-group offset term of a block's product,
once per program on the tensor cores instead of once per group step.

A block's weight is w = offset + scale * t per (row, group), so its product
with x splits into sum_g scale[n, g] (t x)[g] (the K loop of
moe_decode.block_matmul) and sum_g offset[n, g] xs[g, m] with xs the group
sums of x: a [BN, G] @ [G, BM] product. Applied in the K loop it cost 16
FFMA per thread per step, the sums' load and a shared-memory round trip with
a barrier to bring them into the accumulator's layout (Triton 3.6 SASS of
the 2-bit gate/up loop: 229 -> 19x instructions without it,
benchmarks/NOTES.md session 12). Here it is a few mma after the loop.

Precision: the offsets are fp16 already (exact as mma operands); the sums
are fp32, so each enters as two fp16 parts, hi = fp16(s) and lo =
fp16((s - hi) 2^LO_SHIFT) in a product of its own, which keeps ~22 of their
24 bits; s is scaled by 2^-SUM_SHIFT first so that no sum of 128 fp16
activations (|s| <= 128 * 65504) overflows fp16. Products are exact and
accumulate in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import weight_layout

TILE_ROWS = tl.constexpr(weight_layout.TILE_ROWS)
# Groups per product: one product per program for K <= 4096 (one round trip
# of the loads, whose latency is what the term costs; 16 per product, two
# round trips for Mixtral, made the layer 14-24 % slower: moe_h200_s12_*.json).
GROUPS_PER_DOT = tl.constexpr(32)
# |sum of 128 fp16| < 2^7 * 2^16 = 2^23; times 2^-8 it is < 2^15 < fp16 max.
SUM_SHIFT = 8
_SUM_DOWN = tl.constexpr(2.0 ** -SUM_SHIFT)
_SUM_UP = tl.constexpr(2.0 ** SUM_SHIFT)
# |s - fp16(s)| <= 2^-11 |fp16(s)|: the remainder times 2^11 stays normal
# (down to sums of ~2^-14) and below fp16 max.
LO_SHIFT = 11
_LO_UP = tl.constexpr(2.0 ** LO_SHIFT)
_LO_DOWN = tl.constexpr(2.0 ** -LO_SHIFT)


@triton.jit
def offset_term(arena_ptr, sa, sb, sk, g0, g1, xs_ptrs, xs_mask, xs_group_stride,
                XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """fp32 [BN, BM] = sum over groups g in [g0, g1) of offset[n, g] * xs[g, m].

    sa, sb, sk: the block's scale region as tile_pages returns it (int32 [BN]
    word bases before and after the row's page break, the break in groups);
    the (scale, offset) fp16 pair of (row, group g) is the word at base +
    g * TILE_ROWS. xs_ptrs: fp32 pointers [BM] to the activation sums of group
    0, XS_SUB partial sums per group, xs_group_stride apart per group;
    xs_mask: [BM] tokens that exist (others contribute 0).
    """
    k = tl.arange(0, GROUPS_PER_DOT)
    acc = tl.zeros((BN, BM), tl.float32)
    acc_lo = tl.zeros((BN, BM), tl.float32)
    # Not pipelined: a program runs this loop once or a few times, and staged
    # copies would take shared memory from the K loop.
    for c0 in tl.range(g0, g1, GROUPS_PER_DOT, num_stages=1):
        g = c0 + k  # [16]
        live = g < g1
        base = tl.where(g[None, :] < sk[:, None], sa[:, None], sb[:, None])  # [BN, 16]
        sw = tl.load(arena_ptr + base + g[None, :] * TILE_ROWS, mask=live[None, :], other=0)
        offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)  # [BN, 16]
        sums_at = xs_ptrs[None, :] + g[:, None] * xs_group_stride  # [16, BM]
        sums_mask = live[:, None] & xs_mask[None, :]
        sums = tl.load(sums_at, mask=sums_mask, other=0.0)
        for j in tl.static_range(1, XS_SUB):
            sums += tl.load(sums_at + j, mask=sums_mask, other=0.0)
        sums = sums * _SUM_DOWN  # [16, BM] fp32
        hi = sums.to(tl.float16)
        lo = ((sums - hi.to(tl.float32)) * _LO_UP).to(tl.float16)
        acc = tl.dot(offset, hi, acc)
        acc_lo = tl.dot(offset, lo, acc_lo)
    return (acc + acc_lo * _LO_DOWN) * _SUM_UP
