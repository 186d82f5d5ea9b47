"""Triton device functions: read one block's fields through the page table and
turn them into fp16 tensor-core operands (docs/WEIGHT_LAYOUT.md, v4).

How the reads stay whole: a field's byte string holds its rows in tiles of
64 (since v2), so the words of one (tile, group) are one contiguous run
(2 KiB for a 2-bit field); a program's step over 64 or 128 rows reads one or two runs
instead of one 32-byte chunk from each of 128 rows 1 KiB apart (v1). Measured
without any decode (benchmarks/bench_access.py): 48-56 % of the copy
bandwidth in v1's order, 71-94 % tile-major.

How the decode stays cheap (instructions per weight, not per element):
* codes are rebuilt eight at a time, as 4-bit nibbles of one 32-bit word: v4
  stores each field's bits of a nibble word where the nibble's bits lie,
  rotated by one of four amounts, so the fields of a nibble word merge with
  one LOP3 each (the mask an immediate) and one rotation puts the word in
  place: 2 LOP3 + 1 SHF per 8 weights for the top four bits (3 and 4 bits);
* pairs of nibbles are masked out where they lie and read as fp16
  subnormals t 2^p 2^-24 (one LOP3 per two weights, one shift per four); 6
  and 8 bits merge a top and a bottom nibble word into bytes (one LOP3 per
  four weights) and split those with a byte permute into subnormal pairs; the
  2-bit view masks field 0 in place. The place 2^p moves into the
  activations, staged once per token in three planes (weight_layout
  plane_scales), the 2^24 into the scale: no offset to take out, no
  per-weight conversion;
* the per-group scale and offset are applied to the dot product of the group,
  sum_k x_k (o + s t_k) = o * sum(x) + s * sum(x t), with the activation group
  sums precomputed once per token;
* each thread decodes the 32 weights of one quarter of a row, which is what
  it holds of the mma A operand; the activations are stored in the matching
  in-group order (weight_layout.virtual_to_actual), so no data moves between
  threads (benchmarks/sass_loops.py counts no shuffles).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import weight_layout

GROUP = 128
TILE_ROWS = tl.constexpr(weight_layout.TILE_ROWS)


@triton.jit
def _rotl(x, r, USE_ASM: tl.constexpr):
    # uint32 x rotated left by r (int32 in [0, 32), a constant per element
    # after unrolling): one funnel shift.
    if USE_ASM:
        return tl.inline_asm_elementwise("shf.l.wrap.b32 $0, $1, $1, $2;", "=r,r,r", [x, r.to(tl.uint32)],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return (x << r) | (x >> ((32 - r) & 31))


@triton.jit
def _select(a, m, b, USE_ASM: tl.constexpr):
    # a where m, b elsewhere (uint32): one LOP3 with m as its immediate. Written
    # as and/or, ptxas takes m and ~m as two immediates and issues two.
    if USE_ASM:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xE2;", "=r,r,r,r", [a, m, b],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return (a & m) | (b & ~m)


def _signed(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


def _rotr32(word: int, r: int) -> int:
    return ((word >> r) | (word << (32 - r))) & 0xFFFFFFFF


# Bits of a field word that belong to nibble rotation r = 0..3 (as int32): a
# 2-bit field at nibble bits 2-3 (fields 0 and 3) lies at rotr(0xCCCCCCCC, r),
# field 2 (nibble bit 0) at rotr(0x11111111, r).
_TOP = [tl.constexpr(_signed(_rotr32(0xCCCCCCCC, r))) for r in range(4)]
_LOW = [tl.constexpr(_signed(_rotr32(0x11111111, r))) for r in range(4)]
_TOP0, _TOP1, _TOP2, _TOP3 = _TOP
_LOW0, _LOW1, _LOW2, _LOW3 = _LOW
_HIGH_NIBBLES = tl.constexpr(_signed(0xF0F0F0F0))


@triton.jit
def _rot_masks(r):
    # (top, low) masks of rotation r (int32 tensor of constants) as uint32.
    m_top = tl.where(r == 0, _TOP0, tl.where(r == 1, _TOP1, tl.where(r == 2, _TOP2, _TOP3)))
    m_low = tl.where(r == 0, _LOW0, tl.where(r == 1, _LOW1, tl.where(r == 2, _LOW2, _LOW3)))
    return m_top.to(tl.uint32, bitcast=True), m_low.to(tl.uint32, bitcast=True)


# What _nibble_words merges into each nibble (KIND): the top pair alone (the
# low nibble of the 6-bit view), top pair + one bit (3-bit view; nibble bit 0
# is left over and masked by the caller), top pair + two bits (4-bit), top
# pair + bottom pair (the low nibble of the 8-bit view).
TOP_ONLY: tl.constexpr = tl.constexpr(0)
TOP_ONE: tl.constexpr = tl.constexpr(1)
TOP_ONE_ONE: tl.constexpr = tl.constexpr(2)
TOP_PAIR: tl.constexpr = tl.constexpr(3)


@triton.jit
def _nibble_words(top, mid, low, r, KIND: tl.constexpr, USE_ASM: tl.constexpr):
    """uint32 [BN, 4, 2, 2] nibble words (quarter c, word w, half h; rotation
    r = 2 h + w): nibble j (bits 4j..4j+3) of word (c, w, h) holds four code
    bits of weight 32c + 16w + 8h + j. top: 2-bit field words [BN, 4, 2];
    mid, low: 1-bit field words [BN, 4], or (TOP_PAIR) mid a second 2-bit
    field [BN, 4, 2]. The fields are stored pre-rotated by -r (v4), so each
    source is taken where it lies (one LOP3 each) and the word then rotated
    into place once."""
    m_top, m_low = _rot_masks(r)
    a = top[:, :, :, None]
    if KIND == TOP_PAIR:
        t = _select(a, m_top, mid[:, :, :, None], USE_ASM)
    elif KIND == TOP_ONLY:
        t = a & m_top
    else:
        t = _select(a, m_top, mid[:, :, None, None], USE_ASM)
        if KIND == TOP_ONE_ONE:
            t = _select(low[:, :, None, None], m_low, t, USE_ASM)
    return _rotl(t, r, USE_ASM)


@triton.jit
def _nibble_pairs(src, MASK: tl.constexpr):
    # src: uint32 [.., 2 (s)], a nibble word and the same >> 8 -> [.., s, ab]:
    # nibbles 2s + ab (low half) and 2s + ab + 4 (high half) masked in place.
    return tl.join(src & MASK, src & (MASK << 4))


@triton.jit
def _prmt(x, SELECTOR: tl.constexpr, USE_ASM: tl.constexpr):
    # Bytes (0, 2) (SELECTOR 0x4240) or (1, 3) (0x4341) of x into the low bytes
    # of its two halves, zeros above.
    if USE_ASM:
        return tl.inline_asm_elementwise(f"prmt.b32 $0, $1, 0, {SELECTOR:#x};", "=r,r", [x],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    elif SELECTOR == 0x4240:
        return x & 0x00FF00FF
    else:
        return (x >> 8) & 0x00FF00FF


@triton.jit
def _byte_pairs(hi, lo, USE_ASM: tl.constexpr):
    # Nibble words of the top and bottom four code bits -> [.., s, ab] uint32:
    # the 8-bit lane codes of weights j = 2s + ab and j + 4 in the two halves.
    high = tl.full(hi.shape, _HIGH_NIBBLES, tl.int32).to(tl.uint32, bitcast=True)
    b_even = _select(hi << 4, high, lo, USE_ASM)  # byte k: weight 2k
    b_odd = _select(hi, high, lo >> 4, USE_ASM)  # byte k: weight 2k + 1
    even = tl.join(_prmt(b_even, 0x4240, USE_ASM), _prmt(b_even, 0x4341, USE_ASM))  # [.., s]
    odd = tl.join(_prmt(b_odd, 0x4240, USE_ASM), _prmt(b_odd, 0x4341, USE_ASM))
    return tl.join(even, odd)  # [.., s, ab]


@triton.jit
def decode_tile(f0, f1, f2, f3, f4, NF: tl.constexpr, BN: tl.constexpr, USE_ASM: tl.constexpr):
    """fp16 [BN, 128] of one group in the virtual K order
    (weight_layout.virtual_to_actual): each weight masked where its code lies
    and read as the subnormal fp16 t 2^p 2^-24 (t the view's code, 2^p its
    place, staged into the activations: weight_layout.plane_scales; no offset
    to take out).

    f0, f3, f4: uint32 [BN, 4, 2] (2-bit fields: quarter c, word); f1, f2:
    uint32 [BN, 4] (1-bit fields: quarter c). Fields >= NF are ignored.
    """
    if NF == 1:
        # Field 0 alone, read in place: word 1 rotated by one so that both
        # words hold half 0 at nibble bits 2-3 and half 1 at bits 0-1.
        words = _rotl(f0, tl.arange(0, 2)[None, None, :], USE_ASM)[:, :, :, None]  # [BN, 4, 2, 1]
        src = tl.join(words, words >> 8)  # [BN, c, w, 1, s]
        hv = tl.arange(0, 2)[None, None, None, :, None]
        pairs = _nibble_pairs(src & tl.where(hv == 0, 0x00CC00CC, 0x00330033), 0x000F000F)  # [BN, c, w, h, s, ab]
    else:
        r = 2 * tl.arange(0, 2)[None, None, None, :] + tl.arange(0, 2)[None, None, :, None]  # [1, 1, w, h]
        if NF == 2:
            nib = _nibble_words(f0, f1, f1, r, TOP_ONE, USE_ASM)
        else:
            nib = _nibble_words(f0, f1, f2, r, TOP_ONE_ONE, USE_ASM)  # [BN, c, w, h]
        if NF <= 3:
            src = tl.join(nib, nib >> 8)  # [BN, c, w, h, s]
            pairs = _nibble_pairs(src, 0x000F000F if NF == 3 else 0x000E000E)  # [BN, c, w, h, s, ab]
        else:
            if NF == 5:
                low = _nibble_words(f3, f4, f4, r, TOP_PAIR, USE_ASM)
            else:
                low = _nibble_words(f3, f3, f3, r, TOP_ONLY, USE_ASM)
            pairs = _byte_pairs(nib, low, USE_ASM)  # [BN, c, w, h, s, ab]
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16))  # [BN, c, w, h, s, ab, e]
    halves = tl.permute(halves, (0, 2, 3, 4, 5, 1, 6))  # [BN, w, h, s, ab, c, e]
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
                 xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off,
                 XS_SUB: tl.constexpr, NF: tl.constexpr, BN: tl.constexpr,
                 BM: tl.constexpr, USE_ASM: tl.constexpr):
    """acc fp32 [BN, BM] = W_b[rows, groups g0..g1) @ x[groups]^T for one block.

    arena_ptr: int32 [num_pages * page_bytes / 4] the arena as words;
    pt_blk_ptr: int32 [5, max_pages] the block's page-table rows (field stride
    pt_field_stride); rows: int32 [BN] in-range row indices; xt_ptrs: fp16
    pointers [128, BM] to group 0 of the activation tile (virtual order);
    xs_ptrs: fp32 pointers [BM] to the activation sums of group 0, XS_SUB
    partial sums per group, xs_group_stride apart per group (sums of plane 0).
    plane_off: elements from one activation plane to the next (plane 1: times
    weight_layout.view_scales(2 or 3 fields), plane 2: for one field).
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
    # The decode yields t 2^p 2^-24 against activations staged times 2^-p,
    # except for a constant factor per view (the 3-bit code sits one bit up
    # its nibble, the 6-bit code two bits up its byte): fold 2^24 / factor
    # into the scale. The activations' plane of the view sits plane * plane_off
    # elements after plane 0 (weight_layout.view_plane).
    if NF == 2:
        inv_step = 8388608.0  # 2^23
    elif NF == 4:
        inv_step = 4194304.0  # 2^22
    else:
        inv_step = 16777216.0  # 2^24
    if NF == 1:
        xt_ptrs += 2 * plane_off
    elif NF <= 3:
        xt_ptrs += plane_off
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
            xt = tl.load(xt_ptrs + g * 128, mask=xt_mask, other=0.0)  # [128, BM] fp16 x 2^-p
            part = tl.dot(w, xt)  # [BN, BM] = 2^-24 sum t x (times the view's factor)
            scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * inv_step
            offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            acc = acc + part * scale[:, None]
            acc = acc + offset[:, None] * xs[None, :]
        gs = ge
    return acc


@triton.jit
def block_matmul_any(nf, arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                     xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off,
                     XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                     USE_ASM: tl.constexpr):
    """block_matmul specialised on the block's run-time field count nf (1..5)."""
    if nf == 1:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, XS_SUB, 1, BN, BM, USE_ASM)
    elif nf == 2:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, XS_SUB, 2, BN, BM, USE_ASM)
    elif nf == 3:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, XS_SUB, 3, BN, BM, USE_ASM)
    elif nf == 4:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, XS_SUB, 4, BN, BM, USE_ASM)
    else:
        acc = block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                           xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, XS_SUB, 5, BN, BM, USE_ASM)
    return acc
