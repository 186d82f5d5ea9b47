"""Triton device functions: turn one group of a block's fields (docs/WEIGHT_LAYOUT.md,
v4) into the fp16 A operand of the tensor-core product (kernels/moe_block_matmul.py
reads the fields through the page table and runs the K loop).

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
* each thread decodes the 32 weights of one quarter of a row, which is what
  it holds of the mma A operand; the activations are stored in the matching
  in-group order (weight_layout.virtual_to_actual), so no data moves between
  threads (benchmarks/sass_loops.py counts no shuffles).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rotl(x, r, USE_ASM: tl.constexpr):
    # uint32 x rotated left by r (int32 in [0, 32), a constant per element
    # after unrolling): one funnel shift.
    if USE_ASM:
        return tl.inline_asm_elementwise("shf.l.wrap.b32 $0, $1, $1, $2;", "=r,r,r", [x, r.to(tl.uint32)],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return (x << r) | (x >> ((32 - r) & 31))


@triton.jit
def select_bits(a, m, b, USE_ASM: tl.constexpr):
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
HIGH_NIBBLES = tl.constexpr(_signed(0xF0F0F0F0))


@triton.jit
def _rot_masks(r):
    # (top, low) masks of rotation r (int32 tensor of constants) as uint32.
    m_top = tl.where(r == 0, _TOP0, tl.where(r == 1, _TOP1, tl.where(r == 2, _TOP2, _TOP3)))
    m_low = tl.where(r == 0, _LOW0, tl.where(r == 1, _LOW1, tl.where(r == 2, _LOW2, _LOW3)))
    return m_top.to(tl.uint32, bitcast=True), m_low.to(tl.uint32, bitcast=True)


# What nibble_words merges into each nibble (KIND): the top pair alone (the
# low nibble of the 6-bit view), top pair + one bit (3-bit view; nibble bit 0
# is left over and masked by the caller), top pair + two bits (4-bit), top
# pair + bottom pair (the low nibble of the 8-bit view).
TOP_ONLY: tl.constexpr = tl.constexpr(0)
TOP_ONE: tl.constexpr = tl.constexpr(1)
TOP_ONE_ONE: tl.constexpr = tl.constexpr(2)
TOP_PAIR: tl.constexpr = tl.constexpr(3)


@triton.jit
def nibble_words(top, mid, low, r, KIND: tl.constexpr, USE_ASM: tl.constexpr):
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
        t = select_bits(a, m_top, mid[:, :, :, None], USE_ASM)
    elif KIND == TOP_ONLY:
        t = a & m_top
    else:
        t = select_bits(a, m_top, mid[:, :, None, None], USE_ASM)
        if KIND == TOP_ONE_ONE:
            t = select_bits(low[:, :, None, None], m_low, t, USE_ASM)
    return rotl(t, r, USE_ASM)


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
    high = tl.full(hi.shape, HIGH_NIBBLES, tl.int32).to(tl.uint32, bitcast=True)
    b_even = select_bits(hi << 4, high, lo, USE_ASM)  # byte k: weight 2k
    b_odd = select_bits(hi, high, lo >> 4, USE_ASM)  # byte k: weight 2k + 1
    even = tl.join(_prmt(b_even, 0x4240, USE_ASM), _prmt(b_even, 0x4341, USE_ASM))  # [.., s]
    odd = tl.join(_prmt(b_odd, 0x4240, USE_ASM), _prmt(b_odd, 0x4341, USE_ASM))
    return tl.join(even, odd)  # [.., s, ab]


# Token tiles under this are multiplied by mma.sync (Triton 3.6 takes wgmma
# from 16 tokens up), whose fp16 A operand Triton lays out with kWidth 4: a
# thread holds 4 consecutive K of each 16, not the pairs 2t, 2t + 1, 2t + 8,
# 2t + 9 of wgmma's. decode_tile then puts quarter c on K bits 2-3 instead of
# bits 1-2, so that each thread's decoded weights are again what it holds of
# the operand (sm_90 SASS, 4-bit gate/up loop at 8 tokens: 430 instructions
# with the wgmma order, 277 with this one; 272 at 16 tokens by wgmma).
MIN_WGMMA_TOKENS: tl.constexpr = tl.constexpr(16)


@triton.jit
def tile_k_order(k, BM: tl.constexpr):
    """Virtual in-group position (0..127) of decode_tile's column k for a
    BM-token tile: the column itself from MIN_WGMMA_TOKENS up; below,
    column 64 w + 32 h + 16 s + 4 c + 2 ab + e holds position
    64 w + 32 h + 16 s + 8 ab + 2 c + e (weight_layout.slot_virtual). The
    activation planes are staged in this order, so that the launches read
    their rows contiguously."""
    if BM < MIN_WGMMA_TOKENS:
        return (k & 0x71) | ((k & 0x2) << 2) | (((k >> 2) & 0x3) << 1)
    else:
        return k


@triton.jit
def virtual_slot(v, BM: tl.constexpr):
    """Inverse of tile_k_order: the decoded column (the planes' slot,
    weight_layout.slot_virtual) of virtual in-group position v for a BM-token
    tile."""
    if BM < MIN_WGMMA_TOKENS:
        return (v & 0x71) | (((v >> 3) & 0x1) << 1) | (((v >> 1) & 0x3) << 2)
    else:
        return v


@triton.jit
def decode_tile(f0, f1, f2, f3, f4, NF: tl.constexpr, BN: tl.constexpr, USE_ASM: tl.constexpr, BM: tl.constexpr):
    """fp16 [BN, 128] of one group, column j the weight at virtual in-group
    position tile_k_order(j, BM) (weight_layout.virtual_to_actual): each
    weight masked where its code lies and read as the subnormal fp16
    t 2^p 2^-24 (t the view's code, 2^p its place, staged into the
    activations: weight_layout.plane_scales; no offset to take out). BM: the
    product's tokens (tile_k_order says why it matters).

    f0, f3, f4: uint32 [BN, 4, 2] (2-bit fields: quarter c, word); f1, f2:
    uint32 [BN, 4] (1-bit fields: quarter c). Fields >= NF are ignored.
    """
    if NF == 1:
        # Field 0 alone, read in place: word 1 rotated by one so that both
        # words hold half 0 at nibble bits 2-3 and half 1 at bits 0-1.
        words = rotl(f0, tl.arange(0, 2)[None, None, :], USE_ASM)[:, :, :, None]  # [BN, 4, 2, 1]
        src = tl.join(words, words >> 8)  # [BN, c, w, 1, s]
        hv = tl.arange(0, 2)[None, None, None, :, None]
        pairs = _nibble_pairs(src & tl.where(hv == 0, 0x00CC00CC, 0x00330033), 0x000F000F)  # [BN, c, w, h, s, ab]
    else:
        r = 2 * tl.arange(0, 2)[None, None, None, :] + tl.arange(0, 2)[None, None, :, None]  # [1, 1, w, h]
        if NF == 2:
            nib = nibble_words(f0, f1, f1, r, TOP_ONE, USE_ASM)
        else:
            nib = nibble_words(f0, f1, f2, r, TOP_ONE_ONE, USE_ASM)  # [BN, c, w, h]
        if NF <= 3:
            src = tl.join(nib, nib >> 8)  # [BN, c, w, h, s]
            pairs = _nibble_pairs(src, 0x000F000F if NF == 3 else 0x000E000E)  # [BN, c, w, h, s, ab]
        else:
            if NF == 5:
                low = nibble_words(f3, f4, f4, r, TOP_PAIR, USE_ASM)
            else:
                low = nibble_words(f3, f3, f3, r, TOP_ONLY, USE_ASM)
            pairs = _byte_pairs(nib, low, USE_ASM)  # [BN, c, w, h, s, ab]
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16))  # [BN, c, w, h, s, ab, e]
    if BM < MIN_WGMMA_TOKENS:
        halves = tl.permute(halves, (0, 2, 3, 4, 1, 5, 6))  # [BN, w, h, s, c, ab, e]
    else:
        halves = tl.permute(halves, (0, 2, 3, 4, 5, 1, 6))  # [BN, w, h, s, ab, c, e]
    return tl.reshape(halves, (BN, 128)).to(tl.float16, bitcast=True)
