"""Triton device function: one block's product with one token, K groups on
the lanes (the *lanes* form of the one-token tile, MoeTiles.token_lanes).

Why a second form of the one-token tile: kernels/moe_block_matmul.py gives
each thread one row and walks the K groups, so every thread stages the
token's whole group of int16 activations at every step (256 bytes copied and
read back per thread: 38 LDGSTS + 23 LDS of the 258 instructions of a 4-bit
step, Triton 3.6 sm_90) and holds it in 64 registers (224 in all: two
programs per multiprocessor). Here item i of a step is (row i // LANES,
group i % LANES): with one item per thread and LANES = K / 128 groups, lane
g of every warp owns group g for the whole launch. It loads that group's
activations once and walks the rows, LANES / 32 warps' worth... rather: a
step takes BN / LANES rows, each thread decoding one (row, group) item of
the layout (docs/WEIGHT_LAYOUT.md, v4: the bytes of one (tile, group) are
one run, so a lane reads its item from its own run) and multiplying it with
its own activations by dp2a (kernels/moe_cuda_core.group_dot_items); a row's
sum over the lanes is one butterfly.

Contract: K / 128 == LANES, a power of two that divides BN, with one item
per thread (num_warps = BN / 32); the rows row0 .. row0 + BN lie in whole
64-row tiles (row0 and BN multiples of 64). A (tile, group) run of a field
(64 x 32, 64 x 16 or 64 x 4 bytes) never straddles a page: runs start at
multiples of their size and pages are powers of two of at least a row's
bytes (the wrappers check page_bytes >= row bytes).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import weight_layout
from kernels.moe_cuda_core import group_dot_items, view_place

TILE_ROWS = tl.constexpr(weight_layout.TILE_ROWS)
# Bytes per (row, group) of each field's codes and of a view's scale pair.
TWO_BIT_BYTES = tl.constexpr(32)
ONE_BIT_BYTES = tl.constexpr(16)
SCALE_BYTES = tl.constexpr(weight_layout.SCALE_BYTES_PER_GROUP)


@triton.jit
def _join4(a, b, c, d):
    # Four [BN] -> [BN, 4], element k from the k-th, kept in each thread
    # (joins add an in-thread dimension; a [BN, 4] load would be spread over
    # threads by Triton's coalescing).
    x = tl.join(tl.join(a, b), tl.join(c, d))  # [BN, 2 (x), 2 (y)]: element 2y + x
    return tl.reshape(tl.permute(x, (0, 2, 1)), (x.shape[0], 4))


@triton.jit
def _one_bit_item(arena_ptr, p):
    # uint32 [BN, 4]: the four words at word index p (int64 [BN]).
    w = arena_ptr + p
    return _join4(tl.load(w), tl.load(w + 1), tl.load(w + 2), tl.load(w + 3)).to(tl.uint32, bitcast=True)


@triton.jit
def _two_bit_item(arena_ptr, p):
    # uint32 [BN, 4 (quarter), 2 (word)]: the eight words at word index p.
    w = arena_ptr + p
    even = _join4(tl.load(w), tl.load(w + 2), tl.load(w + 4), tl.load(w + 6))
    odd = _join4(tl.load(w + 1), tl.load(w + 3), tl.load(w + 5), tl.load(w + 7))
    return tl.join(even, odd).to(tl.uint32, bitcast=True)


@triton.jit
def _act_class(a, off):
    # int32 [BN, span, h, p]: words 32 span + 4 h + 2 p + off of each item's
    # group (a: int32 pointers [BN] to its word 0).
    p0 = tl.join(tl.load(a + off), tl.load(a + off + 2))  # [BN, p]
    p1 = tl.join(tl.load(a + off + 4), tl.load(a + off + 6))
    p2 = tl.join(tl.load(a + off + 32), tl.load(a + off + 34))
    p3 = tl.join(tl.load(a + off + 36), tl.load(a + off + 38))
    x = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [BN, p, h, span]
    return tl.permute(x, (0, 3, 2, 1))


@triton.jit
def item_activations(a):
    """The eight int32 [BN, span, h, p] tensors group_dot_items takes (lo0, hi0,
    .., lo3, hi3: class (c2, w) = (k // 2, k % 2), low or high int16 pair)
    of each item's group of int16 activation words, pair order (a: int32
    pointers [BN] to the group's word 0: word 32 span + 16 c2 + 8 w + 4 h +
    2 p + lohi)."""
    return (_act_class(a, 0), _act_class(a, 1), _act_class(a, 8), _act_class(a, 9),
            _act_class(a, 16), _act_class(a, 17), _act_class(a, 24), _act_class(a, 25))


@triton.jit
def run_words(pt_ptr, first_byte, tile, g, n_groups, CB: tl.constexpr, log2p):
    """int64 [items]: arena word index of the (tile, group g) run of a region
    (first_byte: where the region starts in the field's byte string; CB:
    bytes per (row, group)), through the page table row pt_ptr."""
    off = first_byte + (tile * n_groups + g).to(tl.int64) * (TILE_ROWS * CB)
    page = off >> log2p
    entry = tl.load(pt_ptr + page).to(tl.int64)
    return ((entry << log2p) + (off - (page << log2p))) >> 2


@triton.jit
def block_matmul_lanes(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, row0, log2p, act_ptr, qs_ptr, xs_ptr,
                       out_ptr, NF: tl.constexpr, BN: tl.constexpr, LANES: tl.constexpr, USE_ASM: tl.constexpr):
    """out_ptr[r] = sum_k W_b[row0 + r, k] x_k (fp32, rows r < BN below
    n_rows) for one block at its NF-field view and one token.

    act_ptr: int32 pointer to the token's int16 activation words (pair order,
    weight_layout.quantize_activations); qs_ptr: fp32 pointer to their span
    scales [K / 64]; xs_ptr: fp32 pointer to the token's group sums [K / 128]
    (the offset term, as block_matmul). Stores; the caller syncs its CTA
    before reading out_ptr back in another layout.
    """
    R: tl.constexpr = BN // LANES  # rows per step
    i = tl.arange(0, BN)
    g = i % LANES  # [BN] the item's group: its lane's for the whole launch
    r = i // LANES  # [BN] its row inside a step
    acts = item_activations(act_ptr + g * 64)  # 8 x [BN, span, h, p] int32 pairs
    act_scale = tl.join(tl.load(qs_ptr + g * 2), tl.load(qs_ptr + g * 2 + 1))  # [BN, 2]
    xs = tl.load(xs_ptr + g)  # [BN] group sums
    padded = (n_rows + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    if NF == 1 or NF >= 4:
        code_bytes = padded.to(tl.int64) * (LANES * TWO_BIT_BYTES)
    else:
        code_bytes = padded.to(tl.int64) * (LANES * ONE_BIT_BYTES)
    inv_step = view_place(NF)
    for t in tl.static_range(BN // TILE_ROWS):
        tile = row0 // TILE_ROWS + t
        p0 = run_words(pt_blk_ptr, 0, tile, g, LANES, TWO_BIT_BYTES, log2p)
        p1 = p0
        p2 = p0
        p3 = p0
        p4 = p0
        if NF >= 2:
            p1 = run_words(pt_blk_ptr + pt_field_stride, 0, tile, g, LANES, ONE_BIT_BYTES, log2p)
        if NF >= 3:
            p2 = run_words(pt_blk_ptr + 2 * pt_field_stride, 0, tile, g, LANES, ONE_BIT_BYTES, log2p)
        if NF >= 4:
            p3 = run_words(pt_blk_ptr + 3 * pt_field_stride, 0, tile, g, LANES, TWO_BIT_BYTES, log2p)
        if NF >= 5:
            p4 = run_words(pt_blk_ptr + 4 * pt_field_stride, 0, tile, g, LANES, TWO_BIT_BYTES, log2p)
        ps = run_words(pt_blk_ptr + (NF - 1) * pt_field_stride, code_bytes, tile, g, LANES, SCALE_BYTES, log2p)
        for s in tl.range(0, TILE_ROWS // R, num_stages=3):
            rr = s * R + r  # [BN] row inside the tile
            f0 = _two_bit_item(arena_ptr, p0 + rr * 8)
            f1 = f0
            f2 = f0
            f3 = f0
            f4 = f0
            if NF >= 2:
                f1 = _one_bit_item(arena_ptr, p1 + rr * 4)
            if NF >= 3:
                f2 = _one_bit_item(arena_ptr, p2 + rr * 4)
            if NF >= 4:
                f3 = _two_bit_item(arena_ptr, p3 + rr * 8)
            if NF >= 5:
                f4 = _two_bit_item(arena_ptr, p4 + rr * 8)
            sw = tl.load(arena_ptr + ps + rr)  # [BN] (scale, offset) fp16 pair
            part = group_dot_items(f0, f1, f2, f3, f4, acts, act_scale, NF, BN, USE_ASM)  # [BN] sum t x * place
            scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * inv_step
            offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            y = part * scale + offset * xs  # [BN]
            row_sum = tl.sum(tl.reshape(y, (R, LANES)), axis=1)  # [R]
            out_row = t * TILE_ROWS + s * R + tl.arange(0, R)
            tl.store(out_ptr + out_row, row_sum, mask=row0 + out_row < n_rows)


@triton.jit
def block_matmul_lanes_any(nf, arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, row0, log2p, act_ptr, qs_ptr,
                           xs_ptr, out_ptr, BN: tl.constexpr, LANES: tl.constexpr, USE_ASM: tl.constexpr):
    """block_matmul_lanes specialised on the block's run-time field count nf (1..5)."""
    args = (arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, row0, log2p, act_ptr, qs_ptr, xs_ptr, out_ptr)
    if nf == 1:
        block_matmul_lanes(*args, 1, BN, LANES, USE_ASM)
    elif nf == 2:
        block_matmul_lanes(*args, 2, BN, LANES, USE_ASM)
    elif nf == 3:
        block_matmul_lanes(*args, 3, BN, LANES, USE_ASM)
    elif nf == 4:
        block_matmul_lanes(*args, 4, BN, LANES, USE_ASM)
    else:
        block_matmul_lanes(*args, 5, BN, LANES, USE_ASM)
