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
are fp32, so each enters as two fp16 parts, hi = fp16(s) and lo = fp16(s -
hi), scaled by 2^-SUM_SHIFT first so that no sum of 128 fp16 activations
(|s| <= 128 * 65504) overflows fp16. Products are exact and accumulate in
fp32.
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
# Rows of a tile per 128-byte line of its (scale, offset) words.
_ROWS_PER_LINE = tl.constexpr(32)


@triton.jit
def _prefetch_l2(ptrs):
    # Asks L2 for the lines of ptrs, to be kept over streaming data; no result.
    return tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_offsets(arena_ptr, sa, sb, sk, rows, g0, g1):
    """Issue, before the K loop, L2 prefetches of every line of (scale,
    offset) words that add_offset_term reads after it, so that its loads hit
    L2 instead of waiting on HBM (the K loop's own copies of these words are
    evicted by the stream of fields by then). Row r covers group g0 + 32 j +
    r % 32 of its tile's line (r % 64) // 32: all lines of the range."""
    for c0 in tl.range(g0, g1, _ROWS_PER_LINE, num_stages=1):
        g = c0 + rows % _ROWS_PER_LINE
        base = tl.where(g < sk, sa, sb)
        _prefetch_l2(arena_ptr + base + tl.minimum(g, g1 - 1) * TILE_ROWS)


@triton.jit
def add_offset_term(acc, arena_ptr, sa, sb, sk, g0, g1, xs_ptrs, xs_mask, xs_group_stride,
                    XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """acc fp32 [BN, BM] + sum over groups g in [g0, g1) of offset[n, g] * xs[g, m].

    sa, sb, sk: the block's scale region as tile_pages returns it (int32 [BN]
    word bases before and after the row's page break, the break in groups);
    the (scale, offset) fp16 pair of (row, group g) is the word at base +
    g * TILE_ROWS. xs_ptrs: fp32 pointers [BM] to the activation sums of group
    0, XS_SUB partial sums per group, xs_group_stride apart per group;
    xs_mask: [BM] tokens that exist (others contribute 0).

    Error: each sum s enters as hi + lo, off by at most 2^-22 |s| + 2^-17
    (lo is subnormal for |s| < 2^5 once scaled); the products are exact.
    The products accumulate into acc itself, scaled by 2^-SUM_SHIFT for them
    (exact: a power of two), so no second accumulator takes registers.
    """
    k = tl.arange(0, GROUPS_PER_DOT)
    acc = acc * _SUM_DOWN
    # Not pipelined: a program runs this loop once or a few times, and staged
    # copies would take shared memory from the K loop.
    for c0 in tl.range(g0, g1, GROUPS_PER_DOT, num_stages=1):
        g = c0 + k  # [G]
        live = g < g1
        base = tl.where(g[None, :] < sk[:, None], sa[:, None], sb[:, None])  # [BN, G]
        sw = tl.load(arena_ptr + base + g[None, :] * TILE_ROWS, mask=live[None, :], other=0)
        offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)  # [BN, G]
        sums_at = xs_ptrs[None, :] + g[:, None] * xs_group_stride  # [G, BM]
        sums_mask = live[:, None] & xs_mask[None, :]
        sums = tl.load(sums_at, mask=sums_mask, other=0.0)
        for j in tl.static_range(1, XS_SUB):
            sums += tl.load(sums_at + j, mask=sums_mask, other=0.0)
        sums = sums * _SUM_DOWN  # [G, BM] fp32
        hi = sums.to(tl.float16)
        lo = (sums - hi.to(tl.float32)).to(tl.float16)
        acc = tl.dot(offset, hi, acc)
        acc = tl.dot(offset, lo, acc)
    return acc * _SUM_UP
