"""Triton device functions: one group of one block times one token on the CUDA
cores (the one-token tile, MoeTiles block_m 1), by the integer dot product.

kernels/moe_block_matmul.py reads the fields through the page table and runs
the K loop; here a group's fields become *code words*, four codes in the
four bytes of a 32-bit word, and dp2a (two int16 activations times two
unsigned bytes, added into an int32) multiplies them with the token's int16
activations (weight_layout.quantize_activations: pair order, one scale per
span of 64). Why not fp32 products: masking one weight at a time and
converting it took four instructions per weight on the integer/logic pipe
and the FMA pipes together, which on the H200 issue a warp's instruction
every two cycles (integer/logic) or every cycle; here a nibble word of eight
codes costs two masks and two dp2a pairs (the dp2a run on the FMA-heavy pipe,
apart from the masks).

Where the codes sit: byte i of code word (c, h, p, w) holds the code of
weight 32c + 16w + 8h + 2i + p of the group, shifted up by the view's place
for class (h, p): a nibble is masked where it lies (the odd nibbles of a
byte are worth 16), 2-bit codes lie at one of four places, 3 and 6 bits one
or two bits up. Each class is summed on its own and the classes are brought
to one place (class_multiplier) before the int32 sum becomes fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.moe_decode import HIGH_NIBBLES, TOP_ONE, TOP_ONE_ONE, TOP_ONLY, TOP_PAIR, nibble_words, rotl, \
    select_bits
from kernels.weight_layout import ACT_SPAN

# Place of each view's highest class (2-bit: codes at bits 6-7 of a byte;
# 3-bit: the odd nibble one bit up; 4-bit: the odd nibble; 6-bit: two bits
# up): the product of the merged classes is sum(t x) times this.
PLACE_1, PLACE_2, PLACE_3, PLACE_4, PLACE_5 = (tl.constexpr(p) for p in (64, 32, 16, 4, 1))
SPAN_C = tl.constexpr(ACT_SPAN)


@triton.jit
def int16_row_pointers(planes_ptr, scale_ptr, row, K):
    """(int32 pointers [64] to the words of group 0 of row `row` (int64) of
    int16 activations [rows, K], fp32 pointers [2] to its spans' scales in
    [rows, K / 64]): what block_matmul's CUDA-core product reads."""
    words = planes_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    return words + row * (K // 2) + tl.arange(0, 64), scale_ptr + row * (K // SPAN_C) + tl.arange(0, 2)


@triton.jit
def group_activations(act_ptrs, BN: tl.constexpr):
    """int32 [64]: one group's activation words (act_ptrs: int32 pointers
    [64] from int16_row_pointers, moved to the group), for a tile of BN rows
    on BN threads.

    Every thread reads all 64 words, but the copy into shared memory that
    the loop's pipelining makes should still be spread over the threads.
    Triton 3.6's layout pass (the H200 image's) treats a load of fewer
    elements than the program has threads as cheap to repeat and gives it
    the layout of its users, here one whole copy per thread: at 128 rows,
    32 8-byte cp.async a thread and step, issued by every warp (sm_90 SASS,
    benchmarks/NOTES.md session 22). Loaded as two copies of the words (128 elements, one a thread) the
    load keeps a layout of one word per thread, and each thread reads the
    group from shared memory; the second copy is never read. At 64 rows the
    plain load already has one element a thread; other tile heights (not
    chosen by choose_tiles) take the plain load. Triton 3.9 spreads the
    plain load itself: there both forms compile to the same loops.
    """
    if BN == 128:
        copies = tl.load(tl.broadcast_to(act_ptrs[None, :], (2, 64)))  # [2, 64]
        act, _ = tl.split(tl.permute(copies, (1, 0)))
    else:
        act = tl.load(act_ptrs)
    return act


@triton.jit
def view_place(NF: tl.constexpr):
    """fp32 1 / place of the NF-field view's merged classes (see module doc)."""
    if NF == 1:
        return 1.0 / PLACE_1
    elif NF == 2:
        return 1.0 / PLACE_2
    elif NF == 3:
        return 1.0 / PLACE_3
    elif NF == 4:
        return 1.0 / PLACE_4
    else:
        return 1.0 / PLACE_5


@triton.jit
def code_words(f0, f1, f2, f3, f4, NF: tl.constexpr, USE_ASM: tl.constexpr):
    """uint32 [BN, 4 (c), 2 (h), 2 (p), 2 (w)] code words of one group (the
    module doc gives where each code sits). Fields as decode_tile takes them:
    f0, f3, f4 uint32 [BN, 4, 2] (2-bit fields: quarter c, word), f1, f2
    uint32 [BN, 4] (1-bit); fields >= NF are ignored."""
    h = tl.arange(0, 2)[None, None, :, None, None]
    p = tl.arange(0, 2)[None, None, None, :, None]
    if NF == 1:
        # Field 0 in place: word 1 rotated by one so that both words hold
        # half 0 at nibble bits 2-3 and half 1 at bits 0-1 (as decode_tile).
        words = rotl(f0, tl.arange(0, 2)[None, None, :], USE_ASM)  # [BN, c, w]
        mask = (0x03030303 << (2 * (1 - h) + 4 * p)).to(tl.uint32, bitcast=True)
        codes = words[:, :, None, None, :] & mask
    else:
        r = 2 * tl.arange(0, 2)[None, None, None, :] + tl.arange(0, 2)[None, None, :, None]  # [1, 1, w, h]
        if NF == 2:
            top = nibble_words(f0, f1, f1, r, TOP_ONE, USE_ASM)
        else:
            top = nibble_words(f0, f1, f2, r, TOP_ONE_ONE, USE_ASM)  # [BN, c, w, h]: top four code bits
        top = tl.permute(top, (0, 1, 3, 2))  # [BN, c, h, w]
        if NF <= 3:
            # 3 bits: the code sits one bit up its nibble (bit 0 is field 2's
            # place, not loaded: masked off).
            low_bits = 0x0E0E0E0E if NF == 2 else 0x0F0F0F0F
            codes = top[:, :, :, None, :] & (low_bits << (4 * p)).to(tl.uint32, bitcast=True)
        else:
            if NF == 5:
                bottom = nibble_words(f3, f4, f4, r, TOP_PAIR, USE_ASM)
            else:
                bottom = nibble_words(f3, f3, f3, r, TOP_ONLY, USE_ASM)  # 6 bits: two bits up
            bottom = tl.permute(bottom, (0, 1, 3, 2))
            high = tl.full(top.shape, HIGH_NIBBLES, tl.int32).to(tl.uint32, bitcast=True)
            even = select_bits(top << 4, high, bottom, USE_ASM)  # byte i: weight 2i
            odd = select_bits(top, high, bottom >> 4, USE_ASM)  # byte i: weight 2i + 1
            codes = tl.permute(tl.join(even, odd), (0, 1, 2, 4, 3))  # [BN, c, h, p, w]
    return codes


@triton.jit
def class_multiplier(NF: tl.constexpr):
    """int32 [1, 1, 2 (h), 2 (p)]: what each class's sum is multiplied by to
    reach the view's highest place (PLACE_<NF>)."""
    h = tl.arange(0, 2)[None, None, :, None]
    p = tl.arange(0, 2)[None, None, None, :]
    if NF == 1:
        mult = (1 << (4 * (1 - p) + 2 * h))  # places 4^(1 - h) 16^p of PLACE_1 = 64
    else:
        mult = (1 << (4 * (1 - p))) + 0 * h  # places 16^p (times 2 for 3 bits)
    return mult


@triton.jit
def _dot_four_words(b0, b1, b2, b3, a0, a1, a2, a3, a4, a5, a6, a7):
    # int32: sum over code words b0..b3 and their four bytes i of byte i
    # (unsigned) times int16 i of b_j's activation pair (a_2j: int16 0-1,
    # a_2j+1: int16 2-3), as one dp2a chain.
    return tl.inline_asm_elementwise(
        "{ .reg .s32 t; dp2a.lo.s32.u32 t, $5, $1, 0; dp2a.hi.s32.u32 t, $6, $1, t; "
        "dp2a.lo.s32.u32 t, $7, $2, t; dp2a.hi.s32.u32 t, $8, $2, t; "
        "dp2a.lo.s32.u32 t, $9, $3, t; dp2a.hi.s32.u32 t, $10, $3, t; "
        "dp2a.lo.s32.u32 t, $11, $4, t; dp2a.hi.s32.u32 $0, $12, $4, t; }",
        "=r,r,r,r,r,r,r,r,r,r,r,r,r", [b0, b1, b2, b3, a0, a1, a2, a3, a4, a5, a6, a7],
        dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _dot_words_plain(codes, a, BN: tl.constexpr):
    # _dot_four_words for every class at once in plain integer ops (the
    # interpreter has no PTX): codes uint32 [BN, span, h, p, c2, w], a int32
    # [span, h, p, c2, w, lohi] -> int32 [BN, span, h, p]. On whole tensors
    # rather than word by word: the interpreter's time goes by the op.
    places = tl.reshape(8 * tl.arange(0, 4), (1, 1, 1, 1, 1, 1, 4))
    code_bytes = (tl.expand_dims(codes.to(tl.int32, bitcast=True), 6) >> places) & 0xFF  # [..., c2, w, byte]
    # byte 2 lohi + half's activation: that half of word lohi
    halves = tl.reshape(tl.join((a << 16) >> 16, a >> 16), (2, 2, 2, 2, 2, 4))  # [span, h, p, c2, w, byte]
    prods = tl.reshape(code_bytes * halves[None], (BN, 2, 2, 2, 16))
    return tl.sum(prods, axis=4)


@triton.jit
def _split_pair(x):
    # x [..., 2, 2] -> the four [...] slices (0, 0), (0, 1), (1, 0), (1, 1).
    x0, x1 = tl.split(x)
    x00, x01 = tl.split(x0)
    x10, x11 = tl.split(x1)
    return x00, x10, x01, x11


@triton.jit
def _sum_last(x):
    a, b = tl.split(x)
    return a + b


@triton.jit
def group_dot(f0, f1, f2, f3, f4, act, act_scale, NF: tl.constexpr, BN: tl.constexpr, USE_ASM: tl.constexpr):
    """fp32 [BN]: PLACE_<NF> times the sum over the group of t x (t the
    view's codes, x the token's activations); the caller multiplies by
    view_place(NF) with the group's scale.

    act: int32 [64] the group's int16 activations as words, pair order
    (weight_layout.quantize_activations); act_scale: fp32 [2] the scales of
    its two spans. Only splits and in-thread sums: with one row per thread
    every row's work stays in its thread.
    """
    codes = code_words(f0, f1, f2, f3, f4, NF, USE_ASM)  # [BN, c, h, p, w]
    # c = 2 span + c2; per class (span, h, p) the four words (c2, w) -> one chain
    codes = tl.permute(tl.reshape(codes, (BN, 2, 2, 2, 2, 2)), (0, 1, 3, 4, 2, 5))  # [BN, span, h, p, c2, w]
    # Word (c, w, h, p, lohi) holds the int16 of weights 32c + 16w + 8h + 2i + p
    # for i = 2 lohi, 2 lohi + 1.
    a = tl.permute(tl.reshape(act, (2, 2, 2, 2, 2, 2)), (0, 3, 4, 1, 2, 5))  # [span, h, p, c2, w, lohi]
    if USE_ASM:
        b0, b1, b2, b3 = _split_pair(codes)  # [BN, span, h, p]
        a_lo, a_hi = tl.split(a)
        lo0, lo1, lo2, lo3 = _split_pair(a_lo)  # [span, h, p], same (c2, w) order as the codes
        hi0, hi1, hi2, hi3 = _split_pair(a_hi)
        part = _dot_four_words(b0, b1, b2, b3, lo0[None], hi0[None], lo1[None], hi1[None], lo2[None], hi2[None],
                               lo3[None], hi3[None])  # [BN, span, h, p] one sum per class
    else:
        part = _dot_words_plain(codes, a, BN)
    if NF <= 3:
        part = part * class_multiplier(NF)
    merged = _sum_last(_sum_last(part))  # [BN, span] int32
    return _sum_last(merged.to(tl.float32) * act_scale[None, :])
