"""Triton device functions: read one block's fields through the page table and
turn them into fp16 tensor-core operands (docs/WEIGHT_LAYOUT.md, v3).

How the reads stay whole: a field's byte string holds its rows in tiles of
64 (since v2), so the words of one (tile, group) are one contiguous run
(2 KiB for a 2-bit field); a program's step over 64 or 128 rows reads one or two runs
instead of one 32-byte chunk from each of 128 rows 1 KiB apart (v1). Measured
without any decode (benchmarks/bench_access.py): 48-56 % of the copy
bandwidth in v1's order, 71-94 % tile-major.

How the decode stays cheap (instructions per weight, not per element):
* codes are rebuilt on whole 32-bit words holding four 8-bit lanes: each
  field is shifted to its fixed bit position inside the 8-bit code and OR-ed
  in, one shift and one and-or per field serve four weights (v3 stores a
  1-bit field's four lane weights one byte apart for this);
* the code keeps its fixed 8-bit position whatever the view (t_b << (8 - b)),
  the view's power of two goes into the scale; the 2-bit view alone is read
  where it lies (each weight masked in place as a subnormal fp16 t 4^s 2^-24,
  one LOP3 per pair), against activations staged pre-scaled by 4^-s;
* lanes become fp16 pairs by OR-ing the exponent 0x6400: the pair reads as
  (1024 + q0, 1024 + q1), and the 1024 is folded into the group offset, so no
  per-weight conversion or subtraction remains;
* the per-group scale and offset are applied to the dot product of the group,
  sum_k x_k (o + s t_k) = o * sum(x) + s * sum(x t), with the activation group
  sums precomputed once per token;
* each thread decodes 32 consecutive weights of a row, which is what it holds
  of the mma A operand; the activations are stored in the matching in-group
  order (weight_layout.virtual_to_actual), so no data moves between threads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import weight_layout

GROUP = 128
TILE_ROWS = tl.constexpr(weight_layout.TILE_ROWS)


@triton.jit
def _two_bit_lanes(words, s, POS: tl.constexpr):
    # words: uint32 [BN, 4, 2] of a 2-bit field; s: int32 [1, 1, 1, 4] step.
    # Lane l of result [BN, 4, 2, 4] holds weight 4l + s at bits POS, POS + 1.
    x = words[:, :, :, None]
    left = x << tl.maximum(POS - 2 * s, 0)
    right = x >> tl.maximum(2 * s - POS, 0)
    moved = tl.where(2 * s <= POS, left, right)
    return moved & (0x03030303 << POS)


@triton.jit
def _one_bit_lanes(words, s, POS: tl.constexpr):
    # words: uint32 [BN, 4] of a 1-bit field, weight 16h + 4l + s of the
    # quarter at bit 8l + 4h + s; result [BN, 4, 2, 4]: lane l of (half h, s)
    # holds that weight at bit POS.
    j = tl.arange(0, 2)[None, None, :, None] * 4 + s
    x = words[:, :, None, None]
    left = x << tl.maximum(POS - j, 0)
    right = x >> tl.maximum(j - POS, 0)
    return tl.where(j <= POS, left, right) & (0x01010101 << POS)


@triton.jit
def _split_pairs(lanes, USE_ASM: tl.constexpr):
    # lanes: uint32 [..] of four 8-bit codes -> fp16 pairs (1024 + q) of lanes
    # (0, 2) and (1, 3).
    if USE_ASM:
        even = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, 0x64646464, 0x4240;", "=r,r", [lanes],
            dtype=tl.uint32, is_pure=True, pack=1)
        odd = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, 0x64646464, 0x4341;", "=r,r", [lanes],
            dtype=tl.uint32, is_pure=True, pack=1)
    else:
        even = (lanes & 0x00FF00FF) | 0x64006400
        odd = ((lanes >> 8) & 0x00FF00FF) | 0x64006400
    return even, odd


@triton.jit
def _decode_two_bit(f0, BN: tl.constexpr):
    # One 2-bit field: fp16 [BN, 128] = t * 4^s * 2^-24 in the virtual K order
    # (s = the weight's place in its byte lane): each weight is masked where it
    # lies and read as a subnormal fp16, one LOP3 per pair and one shift per
    # word (lanes 1 and 3), no offset to take out afterwards. The activations
    # of this view are staged pre-scaled by 4^-s (weight_layout.quarter_scales)
    # and block_matmul folds the 2^24 into the scale.
    s = tl.arange(0, 4)[None, None, None, :]
    mask = (0x00030003 << (2 * s)).to(tl.uint32)
    even = f0[:, :, :, None] & mask  # lanes 0 and 2
    odd = (f0 >> 8)[:, :, :, None] & mask  # lanes 1 and 3
    pairs = tl.join(even, odd)  # [BN, c, word, s, ab]
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16))  # [.., e]
    halves = tl.permute(halves, (0, 2, 3, 4, 1, 5))  # [BN, word, s, ab, c, e]
    return tl.reshape(halves, (BN, 128)).to(tl.float16, bitcast=True)


@triton.jit
def decode_tile(f0, f1, f2, f3, f4, NF: tl.constexpr, BN: tl.constexpr, USE_ASM: tl.constexpr):
    """fp16 [BN, 128] = 1024 + (t_b << (8 - b)) in the virtual K order; for
    one field (2 bits) t_2 * 4^s * 2^-24 instead (_decode_two_bit).

    f0, f3, f4: uint32 [BN, 4, 2] (2-bit fields: quarter c, word); f1, f2:
    uint32 [BN, 4] (1-bit fields: quarter c). Fields >= NF are ignored.
    """
    if NF == 1:
        return _decode_two_bit(f0, BN)
    s = tl.arange(0, 4)[None, None, None, :]
    lanes = _two_bit_lanes(f0, s, 6)
    if NF >= 2:
        lanes = lanes | _one_bit_lanes(f1, s, 5)
    if NF >= 3:
        lanes = lanes | _one_bit_lanes(f2, s, 4)
    if NF >= 4:
        lanes = lanes | _two_bit_lanes(f3, s, 2)
    if NF >= 5:
        lanes = lanes | _two_bit_lanes(f4, s, 0)
    # (The compiler traces this part for NF == 1 too, hence the NF guards.)
    even, odd = _split_pairs(lanes, USE_ASM and NF >= 2)
    pairs = tl.join(even, odd)  # [BN, c, word, s, ab]
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16))  # [.., e]
    halves = tl.permute(halves, (0, 2, 3, 4, 1, 5))  # [BN, word, s, ab, c, e]
    return tl.reshape(halves, (BN, 128)).to(tl.float16, bitcast=True)


@triton.jit
def row_pages(pt_ptr, start, row_bytes, CHUNK: tl.constexpr, log2p):
    """Per-row page bases of one field region.

    pt_ptr: int32 [max_pages] page-table row of one (block, field); start:
    int64 [BN] byte offset of each row inside the field's byte string. A row
    spans at most two pages (page_bytes >= row_bytes, checked by wrappers).
    Returns (base_a, base_b, brk): int32 word index of the row's first byte in
    the arena for chunks < brk, and the same for the chunks after the page
    boundary; chunks are CHUNK bytes and never straddle a page.
    """
    page_a = start >> log2p
    page_b = (start + row_bytes - 1) >> log2p
    entry_a = tl.load(pt_ptr + page_a).to(tl.int64)
    entry_b = tl.load(pt_ptr + page_b).to(tl.int64)
    in_page = start - (page_a << log2p)
    brk = ((page_a + 1) << log2p) - start
    base_a = ((entry_a << log2p) + in_page) >> 2
    base_b = ((entry_b << log2p) - brk) >> 2
    return base_a, base_b, (brk // CHUNK).to(tl.int32)


@triton.jit
def tile_pages(pt_ptr, r64, first_byte, n_groups, CB: tl.constexpr, log2p):
    """row_pages for tile-major fields (v2): per-row word bases for group 0.

    r64: int64 [BN] rows; first_byte: byte offset of the region (codes 0,
    scales after the codes); CB: bytes per (row, group). A tile's groups are
    runs of 64 * CB bytes, so chunks are runs and a row's word for group g is
    base + g * 64 * CB / 4.
    """
    tile_bytes = TILE_ROWS * n_groups * CB
    a, b, brk = row_pages(pt_ptr, first_byte + (r64 // TILE_ROWS) * tile_bytes, tile_bytes, TILE_ROWS * CB,
                          log2p)
    inside = (r64 % TILE_ROWS) * (CB // 4)
    return a + inside, b + inside, brk


@triton.jit
def _seg_base(base_a, base_b, brk, gs, ALIGN: tl.constexpr):
    # Row bases valid for the whole segment starting at chunk gs.
    return tl.multiple_of(tl.where(gs < brk, base_a, base_b), ALIGN)


@triton.jit
def _next_brk(brk, gs, ge):
    # First page boundary (in chunks) after gs over all rows, capped at ge.
    return tl.minimum(tl.min(tl.where(brk > gs, brk, ge), axis=0), ge)


@triton.jit
def _load_two_bit(arena_ptr, base, g):
    # -> uint32 [BN, 4, 2]: group g, quarter c (8 bytes), word. Loaded as the
    # row's 8 contiguous words so that the copies are 16 bytes wide.
    off = base[:, None] + (g * (TILE_ROWS * 8) + tl.arange(0, 8)[None, :])
    words = tl.load(arena_ptr + off).to(tl.uint32, bitcast=True)
    return tl.reshape(words, (words.shape[0], 4, 2))


@triton.jit
def _load_one_bit(arena_ptr, base, g, c4):
    # -> uint32 [BN, 4]: group g, quarter c (4 bytes).
    off = base[:, None] + (g * (TILE_ROWS * 4) + c4[None, :])
    return tl.load(arena_ptr + off).to(tl.uint32, bitcast=True)


@triton.jit
def _group_sums(xs_ptrs, g, xs_group_stride, xs_mask, XS_SUB: tl.constexpr):
    # -> fp32 [BM]: activation sums of group g (XS_SUB partial sums added).
    xs = tl.load(xs_ptrs + g * xs_group_stride, mask=xs_mask, other=0.0)
    for j in tl.static_range(1, XS_SUB):
        xs += tl.load(xs_ptrs + g * xs_group_stride + j, mask=xs_mask, other=0.0)
    return xs


@triton.jit
def block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                 xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off,
                 XS_SUB: tl.constexpr, NF: tl.constexpr, BN: tl.constexpr,
                 BM: tl.constexpr, USE_ASM: tl.constexpr):
    """acc fp32 [BN, BM] = W_b[rows, groups g0..g1) @ x[groups]^T for one block.

    arena_ptr: int32 [num_pages * page_bytes / 4] the arena as words;
    pt_blk_ptr: int32 [5, max_pages] the block's page-table rows (field stride
    pt_field_stride); rows: int32 [BN] in-range row indices; xt_ptrs: fp16
    pointers [128, BM] to group 0 of the activation tile (virtual order);
    xs_ptrs: fp32 pointers [BM] to the activation sums of group 0, XS_SUB
    partial sums per group, xs_group_stride apart per group. xq_off: element
    offset from the activations to the same staged with quarter_scales, which
    the one-field (2-bit) decode reads.
    The group range is cut into segments at the page boundaries of the tile's
    rows, so inside a segment every row reads through one fixed page base.
    """
    n_groups = K // 128
    r64 = rows.to(tl.int64)
    c4 = tl.arange(0, 4)
    a0, b0, k0 = tile_pages(pt_blk_ptr, r64, 0, n_groups, 32, log2p)
    a1, b1, k1 = a0, b0, k0
    a2, b2, k2 = a0, b0, k0
    a3, b3, k3 = a0, b0, k0
    a4, b4, k4 = a0, b0, k0
    if NF >= 2:
        a1, b1, k1 = tile_pages(pt_blk_ptr + pt_field_stride, r64, 0, n_groups, 16, log2p)
    if NF >= 3:
        a2, b2, k2 = tile_pages(pt_blk_ptr + 2 * pt_field_stride, r64, 0, n_groups, 16, log2p)
    if NF >= 4:
        a3, b3, k3 = tile_pages(pt_blk_ptr + 3 * pt_field_stride, r64, 0, n_groups, 32, log2p)
    if NF >= 5:
        a4, b4, k4 = tile_pages(pt_blk_ptr + 4 * pt_field_stride, r64, 0, n_groups, 32, log2p)
    # Scales of the NF-field view sit after the codes of field NF - 1 (whole
    # tiles: the last one is padded).
    padded = (n_rows + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    if NF == 1 or NF >= 4:
        code_bytes = padded.to(tl.int64) * (n_groups * 32)
    else:
        code_bytes = padded.to(tl.int64) * (n_groups * 16)
    sa, sb, sk = tile_pages(pt_blk_ptr + (NF - 1) * pt_field_stride, r64, code_bytes, n_groups, 4, log2p)
    # t_b << (8 - b) is what the decode yields: fold 2^-(8-b) into the scale.
    if NF == 1:
        inv_step = 16777216.0  # 2^24: _decode_two_bit reads t 4^s as a subnormal
    elif NF == 2:
        inv_step = 1.0 / 32.0
    elif NF == 3:
        inv_step = 1.0 / 16.0
    elif NF == 4:
        inv_step = 1.0 / 4.0
    else:
        inv_step = 1.0
    acc = tl.zeros((BN, BM), tl.float32)
    # Latency of the two small per-group loads (ncu stall sampling on the H200:
    # their global-load waits and the layout conversions they caused were the
    # largest stalls of the loop). The (scale, offset) load is tied into the
    # decode by a zero that the compiler cannot fold, so Triton's pipeliner
    # treats it as an operand of the dot and streams it through shared memory
    # with the fields, stages ahead; the activation sums of the next group are
    # loaded one iteration ahead by hand.
    zero = K >> 31  # 0 at run time (K < 2^31), opaque to the compiler
    xs_next = _group_sums(xs_ptrs, g0, xs_group_stride, xs_mask, XS_SUB)
    gs = g0
    while gs < g1:
        ge = _next_brk(k0, gs, g1)
        ge = _next_brk(sk, gs, ge)
        p0 = _seg_base(a0, b0, k0, gs, 8)
        p1 = p0
        p2 = p0
        p3 = p0
        p4 = p0
        if NF >= 2:
            ge = _next_brk(k1, gs, ge)
            p1 = _seg_base(a1, b1, k1, gs, 4)
        if NF >= 3:
            ge = _next_brk(k2, gs, ge)
            p2 = _seg_base(a2, b2, k2, gs, 4)
        if NF >= 4:
            ge = _next_brk(k3, gs, ge)
            p3 = _seg_base(a3, b3, k3, gs, 8)
        if NF >= 5:
            ge = _next_brk(k4, gs, ge)
            p4 = _seg_base(a4, b4, k4, gs, 8)
        ps = tl.where(gs < sk, sa, sb)
        for g in range(gs, ge):
            sw = tl.load(arena_ptr + ps + g * TILE_ROWS)  # [BN] (scale, offset) fp16 pair
            xs = xs_next  # [BM] activation sums of group g
            g_next = tl.minimum(g + 1, g1 - 1)
            xs_next = _group_sums(xs_ptrs, g_next, xs_group_stride, xs_mask, XS_SUB)
            f0 = _load_two_bit(arena_ptr, p0, g) | (sw & zero).to(tl.uint32)[:, None, None]
            f1 = f0
            f2 = f0
            f3 = f0
            f4 = f0
            if NF >= 2:
                f1 = _load_one_bit(arena_ptr, p1, g, c4)
            if NF >= 3:
                f2 = _load_one_bit(arena_ptr, p2, g, c4)
            if NF >= 4:
                f3 = _load_two_bit(arena_ptr, p3, g)
            if NF >= 5:
                f4 = _load_two_bit(arena_ptr, p4, g)
            w = decode_tile(f0, f1, f2, f3, f4, NF, BN, USE_ASM)  # [BN, 128] fp16
            if NF == 1:
                # sum (t 4^s 2^-24) (x 4^-s) = 2^-24 sum t x: no 1024 to take out
                xt = tl.load(xt_ptrs + xq_off + g * 128, mask=xt_mask, other=0.0)  # [128, BM] fp16
            else:
                xt = tl.load(xt_ptrs + g * 128, mask=xt_mask, other=0.0)  # [128, BM] fp16
            part = tl.dot(w, xt)  # [BN, BM] = sum (1024 + q) x, or 2^-24 sum t x
            scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * inv_step
            offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            if NF != 1:
                offset = offset - 1024.0 * scale
            acc = acc + part * scale[:, None]
            acc = acc + offset[:, None] * xs[None, :]
        gs = ge
    return acc


@triton.jit
def block_matmul_any(nf, arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                     xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off,
                     XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                     USE_ASM: tl.constexpr):
    """block_matmul specialised on the block's run-time field count nf (1..5)."""
    if nf == 1:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off, XS_SUB, 1, BN, BM, USE_ASM)
    elif nf == 2:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off, XS_SUB, 2, BN, BM, USE_ASM)
    elif nf == 3:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off, XS_SUB, 3, BN, BM, USE_ASM)
    elif nf == 4:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off, XS_SUB, 4, BN, BM, USE_ASM)
    else:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, xq_off, XS_SUB, 5, BN, BM, USE_ASM)
    return acc
