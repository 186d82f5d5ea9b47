"""The kernel of benchmarks/int8_product_probe.py: one 128-row tile of a 4-bit
weight times a 16- or 8-token activation tile, its K loop pipelined by
Triton's pipeliner the engine's way (kernels/moe_block_matmul.py), with the
product taken in one of two forms (MODE):

* FP16: the engine's decode (kernels/moe_decode.py, the 4-bit view): nibble
  pairs masked in place and read as fp16 subnormals t 16^ab 2^-24 against
  activations staged times 16^-ab, one fp16 product (k16 an instruction),
  the group's scale and offset applied to its fp32 sum;
* INT8: the nibbles shifted into bytes (two LOP3 and one shift per 8
  weights) and multiplied as int8 by the activations quantized to int8 per
  (token, group) (k32 an instruction, int32 sums); the group's sum scaled by
  s_row * a_token. The activations' precision changes: the product is
  exact against the quantized activations, not against the fp16 ones.
* STREAM (timing only): the copies and the scale epilogue alone, the codes
  folded into the accumulator by one LOP3-level sum, no product;
* FIELDS (timing only): the engine's own 4-bit read and decode
  (kernels/moe_block_matmul.py, moe_decode.decode_tile with 3 fields): the
  same bytes as three field streams (2-bit words [BN, 4, 2], two 1-bit
  [BN, 4]), each (tile, group) a contiguous run of its field, merged into
  nibble words before the fp16 decode. The column order is not staged
  (the product is wrong by design).

The probe's own layout (not the engine's paged fields): a (tile, group)'s
codes are 2,048 contiguous int32 words [128 rows, 4 quarters, 4 words], 8
nibbles a word; nibble j of word (c, i) holds the code at in-group position
32 c + 8 i + j (int8_product_probe.virtual_position). Scales: int32 [tiles,
groups, 128] (scale fp16 low, offset fp16 high), w = o + s q. A quarter's
words are what one thread of a quad holds of the product's A operand, so
that the decoded tile needs no data movement (the column orders below; the
activations are staged in them: int8_product_probe.column_position).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.moe_decode import decode_tile

FP16, INT8, STREAM, FIELDS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
MODES = {"fp16": 0, "int8": 1, "stream": 2, "fields": 3}
BN = tl.constexpr(128)  # rows of a tile
BK = tl.constexpr(128)  # K of a group (a step)
WORDS = tl.constexpr(16)  # words of a row's group: 128 4-bit codes
STEP_WORDS = tl.constexpr(2048)  # BN * WORDS
SUBNORMAL_SCALE = tl.constexpr(16777216.0)  # 2^24: a masked nibble read as fp16 is t 2^-24


@triton.jit
def _fp16_tile(nib, BM: tl.constexpr):
    # uint32 [BN, c, i] -> fp16 [BN, BK]: element (c, i, s, ab, e) is nibble
    # j = 2 s + ab + 4 e of word (c, i) as the subnormal t 16^ab 2^-24. The
    # quarter c goes to K bits 1-2 (wgmma's pairs 2t, 2t + 1) or, under 16
    # tokens (mma.sync, kWidth 4), to bits 2-3.
    src = tl.join(nib, nib >> 8)  # [BN, c, i, s]
    pairs = tl.join(src & 0x000F000F, src & 0x00F000F0)  # [BN, c, i, s, ab]
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16))  # [BN, c, i, s, ab, e]
    if BM < 16:
        halves = tl.permute(halves, (0, 2, 3, 1, 4, 5))  # [BN, i, s, c, ab, e]
    else:
        halves = tl.permute(halves, (0, 2, 3, 4, 1, 5))  # [BN, i, s, ab, c, e]
    return tl.reshape(halves, (BN, BK)).to(tl.float16, bitcast=True)


@triton.jit
def _nibbles_to_bytes(byts, SHIFT: tl.constexpr, USE_ASM: tl.constexpr):
    # uint8 [..] code bytes -> int8 [..]: nibble SHIFT / 4 of each byte. Four
    # bytes a register in and out (pack 4), so one shift and one LOP3 per 8
    # weights; written as int8 arithmetic (USE_ASM False: the interpreter)
    # the compiler takes each byte apart (sm_90 SASS at 16 tokens: 442
    # instructions a step against 234).
    if not USE_ASM:
        out = ((byts >> SHIFT) & 0xF).to(tl.int8)
    elif SHIFT == 0:
        out = tl.inline_asm_elementwise("and.b32 $0, $1, 0x0F0F0F0F;", "=r,r", [byts], dtype=tl.int8,
                                        is_pure=True, pack=4)
    else:
        out = tl.inline_asm_elementwise("{ .reg .b32 t; shr.b32 t, $1, 4; and.b32 $0, t, 0x0F0F0F0F; }", "=r,r",
                                        [byts], dtype=tl.int8, is_pure=True, pack=4)
    return out


@triton.jit
def _int8_tile(byts, USE_ASM: tl.constexpr, BM: tl.constexpr):
    # uint8 [BN, 64] -> int8 [BN, BK]: byte m = 16 c + 4 i + b of a row holds
    # nibbles 2 b (low) and 2 b + 1 (high) of word (c, i); element (c, i, b,
    # lh) is nibble j = 2 b + lh, the code t itself. The quarter c goes to
    # the K bits of a quad's thread: 2-3 for wgmma's int8 A operand (4
    # consecutive K a register), 3-4 for mma.sync's (Triton 3.6 lays int8
    # out with kWidth 8: 8 consecutive K a thread).
    t = tl.join(_nibbles_to_bytes(byts, 0, USE_ASM), _nibbles_to_bytes(byts, 4, USE_ASM))  # [BN, 64, lh]
    t = tl.reshape(t, (BN, 4, 4, 4, 2))  # [BN, c, i, b, lh]
    if BM < 16:
        t = tl.permute(t, (0, 2, 1, 4, 3))  # [BN, i, c, lh, b]
    else:
        t = tl.permute(t, (0, 2, 4, 1, 3))  # [BN, i, lh, c, b]
    return tl.reshape(t, (BN, BK))


@triton.jit
def int8_probe_kernel(codes_ptr, sw_ptr, xt_ptr, xsum_ptr, xscale_ptr, out_ptr, n_tiles, n_groups, tokens,
                      BM: tl.constexpr, MODE: tl.constexpr, STAGES: tl.constexpr, USE_ASM: tl.constexpr = True):
    """out[tile rows, :tokens] = W[tile rows] @ x^T for tiles program_id(0),
    + num_programs, ... (one a program when the grid is n_tiles; fewer
    programs bound the resident ones, as the engine's 255 registers do).

    codes_ptr: int32 [tiles, groups, BN, WORDS]; sw_ptr: int32 [tiles, groups,
    BN]; xt_ptr: FP16 fp16 [groups, BK, BM] (column order, times 16^-ab),
    INT8 int8 [groups, BM, BK] (column order, K contiguous: an 8-bit wgmma
    reads B K-major); xsum_ptr: fp32 [groups, BM] the activations' group sums
    (of the values the product multiplies); xscale_ptr: fp32 [groups, BM]
    (INT8: the quantization step a of each token's group); out_ptr: fp32
    [tiles * BN, tokens]. Tokens past `tokens` are zero in xt and not stored.
    """
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BM)
    words = tl.arange(0, WORDS)
    k = tl.arange(0, BK)
    zero = n_groups >> 31  # 0 at run time, opaque: ties the scales into the decode (see block_matmul)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        tile = tl.full((), 1, tl.int64) * t  # int64 addresses (a plain int in the interpreter)
        code_base = codes_ptr + tile * n_groups * STEP_WORDS + rows[:, None] * WORDS + words[None, :]
        code_bytes = (codes_ptr.to(tl.pointer_type(tl.uint8)) + tile * n_groups * STEP_WORDS * 4
                      + rows[:, None] * (WORDS * 4) + tl.arange(0, WORDS * 4)[None, :])
        sw_base = sw_ptr + tile * n_groups * BN + rows
        acc = tl.zeros((BN, BM), tl.float32)
        for g in tl.range(0, n_groups, num_stages=STAGES):
            sw = tl.load(sw_base + g * BN)  # [BN] (scale, offset) fp16 pair
            xs = tl.load(xsum_ptr + g * BM + cols)  # [BM]
            scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            if MODE == FP16 or MODE == STREAM:
                w = tl.load(code_base + g * STEP_WORDS).to(tl.uint32, bitcast=True)
                w = w | (sw & zero).to(tl.uint32)[:, None]
            if MODE == FP16:
                a = _fp16_tile(tl.reshape(w, (BN, 4, 4)), BM)  # [BN, c, i] words -> [BN, BK]
                xt = tl.load(xt_ptr + g * BK * BM + k[:, None] * BM + cols[None, :])  # [BK, BM]
                part = tl.dot(a, xt)  # [BN, BM] fp32: 2^-24 sum t x
                acc += part * (scale * SUBNORMAL_SCALE)[:, None]
            elif MODE == FIELDS:
                # The codes buffer as three field regions: 2-bit words (half the
                # bytes), then two 1-bit regions (a quarter each).
                fb = codes_ptr + tile * n_groups * (STEP_WORDS // 2) + g * (STEP_WORDS // 2)
                f0 = tl.load(fb + rows[:, None] * 8 + tl.arange(0, 8)[None, :]).to(tl.uint32, bitcast=True)
                f0 = tl.reshape(f0 | (sw & zero).to(tl.uint32)[:, None], (BN, 4, 2))
                one = codes_ptr + n_tiles * n_groups * (STEP_WORDS // 2) + tile * n_groups * (STEP_WORDS // 4)
                off1 = g * (STEP_WORDS // 4) + rows[:, None] * 4 + tl.arange(0, 4)[None, :]
                f1 = tl.load(one + off1).to(tl.uint32, bitcast=True)
                f2 = tl.load(one + n_tiles * n_groups * (STEP_WORDS // 4) + off1).to(tl.uint32, bitcast=True)
                a = decode_tile(f0, f1, f2, f0, f0, 3, BN, True, BM)  # [BN, BK]
                xt = tl.load(xt_ptr + g * BK * BM + k[:, None] * BM + cols[None, :])  # [BK, BM]
                part = tl.dot(a, xt)
                acc += part * (scale * SUBNORMAL_SCALE)[:, None]
            elif MODE == INT8:
                byts = tl.load(code_bytes + g * STEP_WORDS * 4) | (sw & zero).to(tl.uint8)[:, None]  # [BN, 64]
                a = _int8_tile(byts, USE_ASM, BM)  # [BN, BK]
                xq = tl.load(xt_ptr + g * BK * BM + cols[:, None] * BK + k[None, :])  # [BM, BK] int8
                part = tl.dot(a, tl.trans(xq), out_dtype=tl.int32)  # [BN, BM] int32: sum t xq
                xa = tl.load(xscale_ptr + g * BM + cols)  # [BM]
                acc += part.to(tl.float32) * (scale[:, None] * xa[None, :])
            else:
                acc += tl.sum((w & 0x1).to(tl.float32), axis=1)[:, None] * scale[:, None]
            acc += offset[:, None] * xs[None, :]
        out = out_ptr + (tile * BN + rows)[:, None] * tokens + cols[None, :]
        tl.store(out, acc, mask=cols[None, :] < tokens)
