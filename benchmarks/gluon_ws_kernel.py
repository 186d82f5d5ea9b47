"""The kernel of benchmarks/gluon_ws_probe.py: a warp-specialised 16-token
4-bit MoE step in Gluon (triton.experimental.gluon, Triton 3.6). A probe, not
a kernel of the engine; the question, the modes and what they measured are
in the probe's docstring.

One persistent program (4 consumer warps + a producer partition) takes row
tiles pid, pid + programs, ...; each 128 x 128 (tile, group) step goes
through a ring of STAGES shared-memory slots whose ready / empty mbarriers
say a slot is full or free. The producer (one warp issuing TMA copies, or a
warpgroup issuing 16-byte cp.async: X_MODES) fills it; the consumer reads
the step's code words, decodes them into the product's A operand, multiplies
by the 16 tokens (wgmma or mma.sync: MMAS) and scales the product into its
accumulator, w = o + s q per row and group.

Its own layout (not the engine's v4) is benchmarks/gluon_ws_layout.py's:
CODE_SL and WORD_L4 / WORD_L8 here are its CODE_OFFSETS and word_bases as
Gluon layouts. Imported with the repository root on sys.path (the probe puts it
there).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, mma_v2, tma,
                                                              warpgroup_mma)

from benchmarks import gluon_ws_layout as layout

BN, BK, BM = gl.constexpr(layout.BN), gl.constexpr(layout.BK), gl.constexpr(layout.BM)
WORDS_PER_ROW = gl.constexpr(layout.WORDS_PER_ROW)
CODE_ROWS = gl.constexpr(layout.CODE_ROWS)
NIBBLE_PAIRS = gl.constexpr(0x000F000F)
SUBNORMAL_SCALE = gl.constexpr(layout.SUBNORMAL_SCALE)
CODE_SL = gl.constexpr(gl.SharedLinearLayout(layout.CODE_OFFSETS))
# The consumer's words with 4 or 8 warps (gluon_ws_layout.word_bases).
WORD_L4, WORD_L8 = (gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=regs, lane_bases=lanes, warp_bases=warps, block_bases=[], shape=[layout.BN, layout.WORDS_PER_ROW]))
    for regs, lanes, warps in map(layout.word_bases, layout.CONSUMER_WARPS))


# Shared layouts of the TMA boxes: codes and scales plain rows, activations
# [BK, BM] fp16 swizzled for the wgmma B operand, or that slot seen as a flat
# box of X_FLAT_ROWS x 256 fp16 (X_FLAT).
CODES_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
X_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2))
X_FLAT_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2))
# An 8-token tile's activations (cpasync): K-major [8, BK] fp16 in the 128-byte
# swizzle, the product's B its transposed view. (N-major [BK, 8] fp16 has
# 16-byte rows, no swizzle: its wgmma faulted on the H200, session 33.)
X8_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
X_FLAT_ROWS = gl.constexpr(BK.value * BM.value // 256)
# X_MODES: how the producer brings each step's operands. box / flat / once:
# codes and scales as TMA boxes of 512-byte rows without swizzle (see
# _producer); swz128: boxes of a step's codes and activations of 128-byte
# rows in the 128-byte swizzle, each already in the order that the swizzle
# turns into the consumer's (gluon_ws_layout.swizzle128_order); scales as before.
X_BOX, X_FLAT, X_ONCE, X_SWZ128, X_CPASYNC = (gl.constexpr(layout.X_MODES[m])
                                              for m in ("box", "flat", "once", "swz128", "cpasync"))
# cpasync: a producer warpgroup copies each step by 16-byte cp.async (the
# engine's way, per thread) and each of its threads arrives on the slot's
# ready barrier as its copies land.
CP_PRODUCER_WARPS = gl.constexpr(4)
CP_PRODUCER_THREADS = gl.constexpr(CP_PRODUCER_WARPS.value * 32)
SWZ128_WORDS = gl.constexpr(32)  # a 128-byte row of int32
# A step's 2048 code words in rows of 128 bytes.
WIDE_CODE_ROWS = gl.constexpr(BN.value * WORDS_PER_ROW.value // SWZ128_WORDS.value)
WIDE_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
X_WIDE_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
X_WIDE_ROWS = gl.constexpr(BK.value * BM.value // 64)  # 64 fp16 = 128 bytes
# The product: wgmma (B from shared memory), mma.sync (B from registers), or
# (timing only) none, or nothing read at all (stream: the copies alone).
# nodecode (timing only): wgmma of the words' bits unmasked (_decode4's DECODE).
MMA_WGMMA, MMA_SYNC, MMA_NONE, MMA_STREAM, MMA_NODECODE = (gl.constexpr(layout.MMAS[m])
                                                           for m in ("wgmma", "v2", "none", "stream", "nodecode"))


@gluon.jit
def _decode4(words, PAIR_L: gl.constexpr, A_L: gl.constexpr, DECODE: gl.constexpr):
    """[BN, WORDS_PER_ROW] int32 code words -> the fp16 A operand [BN, BK]
    (q 2^-24), with no data movement between threads. DECODE False (timing
    only): each word stands for all four of its nibble pairs unmasked, so
    the operand has the right shape and no decode instructions."""
    if DECODE:
        p0 = words & NIBBLE_PAIRS
        p1 = (words >> 4) & NIBBLE_PAIRS
        p2 = (words >> 8) & NIBBLE_PAIRS
        p3 = (words >> 12) & NIBBLE_PAIRS
    else:
        p0, p1, p2, p3 = words, words, words, words
    pairs = gl.join(gl.join(p0, p1), gl.join(p2, p3))  # [BN, W, s0, s1]
    pairs = gl.reshape(gl.permute(pairs, [0, 3, 2, 1]), [BN, BK // 2])  # column 16 s + w
    pairs = gl.convert_layout(pairs, PAIR_L, assert_trivial=True)
    lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [pairs], dtype=(gl.float16, gl.float16),
                                       is_pure=True, pack=1)
    return gl.convert_layout(gl.reshape(gl.join(lo, hi), [BN, BK]), A_L, assert_trivial=True)


@gluon.jit
def _producer(codes_desc, scales_desc, x_desc, codes, scales, xs, ready, empty, n_tiles, n_groups, x_copies,
              STAGES: gl.constexpr, X_MODE: gl.constexpr):
    # One warp: for each step wait for its slot to be free, then its TMA
    # copies, all signalling the slot's ready barrier. X_MODE (X_MODES): the
    # activations as a [BK, BM] box of BK 32-byte rows, as a flat box of
    # X_FLAT_ROWS 512-byte rows already in the swizzled order (from copy
    # pid % x_copies of them), (timing only) not after the ring is first
    # filled; or swz128.
    weight_bytes: gl.constexpr = codes_desc.block_type.nbytes + scales_desc.block_type.nbytes
    step_bytes: gl.constexpr = weight_bytes + x_desc.block_type.nbytes
    x_base = (gl.program_id(0) % x_copies) * n_groups
    it = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        for g in range(n_groups):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            chunk = tile * n_groups + g
            if X_MODE == X_SWZ128:
                mbarrier.expect(bar, step_bytes)
                tma.async_copy_global_to_shared(codes_desc, [chunk * WIDE_CODE_ROWS, 0], bar, codes.index(slot))
                tma.async_copy_global_to_shared(scales_desc, [chunk, 0], bar, scales.index(slot))
                tma.async_copy_global_to_shared(x_desc, [(x_base + g) * X_WIDE_ROWS, 0], bar, xs.index(slot))
            else:
                if X_MODE == X_ONCE:
                    if it < STAGES:
                        mbarrier.expect(bar, step_bytes)
                        tma.async_copy_global_to_shared(x_desc, [g * BK, 0], bar, xs.index(slot))
                    else:
                        mbarrier.expect(bar, weight_bytes)
                else:
                    mbarrier.expect(bar, step_bytes)
                    if X_MODE == X_FLAT:
                        dst = xs.index(slot)._reinterpret(gl.float16, [X_FLAT_ROWS, 256], X_FLAT_LAYOUT)
                        tma.async_copy_global_to_shared(x_desc, [(x_base + g) * X_FLAT_ROWS, 0], bar, dst)
                    else:
                        tma.async_copy_global_to_shared(x_desc, [g * BK, 0], bar, xs.index(slot))
                tma.async_copy_global_to_shared(codes_desc, [chunk * CODE_ROWS, 0], bar, codes.index(slot))
                tma.async_copy_global_to_shared(scales_desc, [chunk, 0], bar, scales.index(slot))
            it += 1


@gluon.jit
def _producer_cp(codes_ptr, scales_ptr, x_ptr, codes, scales, xs, ready, empty, n_tiles, n_groups,
                 STAGES: gl.constexpr, GPS: gl.constexpr, TOKENS: gl.constexpr):
    # CP_PRODUCER_WARPS warps: each group's codes (4 x 16 bytes a thread),
    # scales (4 bytes) and activations (TOKENS / 8 x 16 bytes) by cp.async,
    # GPS groups to a slot. x_ptr: [K, 16] (16 tokens) or [8, K] (8 tokens).
    code_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [CP_PRODUCER_WARPS, 1], [1, 0])
    scale_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, CP_PRODUCER_WARPS], [1, 0])
    code_offs = (gl.arange(0, CODE_ROWS, layout=gl.SliceLayout(1, code_l))[:, None] * 128 +
                 gl.arange(0, 128, layout=gl.SliceLayout(0, code_l))[None, :])
    scale_offs = (gl.arange(0, 1, layout=gl.SliceLayout(1, scale_l))[:, None] * BN +
                  gl.arange(0, BN, layout=gl.SliceLayout(0, scale_l))[None, :])
    if TOKENS == 8:
        x_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [CP_PRODUCER_WARPS, 1], [1, 0])
        x_offs = (gl.arange(0, TOKENS, layout=gl.SliceLayout(1, x_l))[:, None] * (n_groups * BK) +
                  gl.arange(0, BK, layout=gl.SliceLayout(0, x_l))[None, :])
        x_group = BK
    else:
        x_l: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [CP_PRODUCER_WARPS, 1], [1, 0])
        x_offs = (gl.arange(0, BK, layout=gl.SliceLayout(1, x_l))[:, None] * TOKENS +
                  gl.arange(0, TOKENS, layout=gl.SliceLayout(0, x_l))[None, :])
        x_group = BK * TOKENS
    it = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        for g0 in range(0, n_groups, GPS):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            for j in gl.static_range(GPS):
                buf = slot * GPS + j
                chunk = tile * n_groups + g0 + j
                async_copy.async_copy_global_to_shared(codes.index(buf),
                                                       codes_ptr + chunk * (CODE_ROWS * 128) + code_offs)
                async_copy.async_copy_global_to_shared(scales.index(buf), scales_ptr + chunk * BN + scale_offs)
                async_copy.async_copy_global_to_shared(xs.index(buf), x_ptr + (g0 + j) * x_group + x_offs)
            async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
            it += 1


@gluon.jit
def _consumer(codes, scales, xs, ready, empty, xsum_ptr, out_ptr, n_tiles, n_groups, STAGES: gl.constexpr,
              MMA: gl.constexpr, X_MODE: gl.constexpr, GPS: gl.constexpr, WARPS: gl.constexpr,
              TOKENS: gl.constexpr):
    # TOKENS: the product's N (BM unless cpasync).
    # The same A, pair and accumulator layouts either way (gl.to_linear_layout).
    if MMA == MMA_SYNC:
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                                        instr_shape=[16, 8])
    else:
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                        instr_shape=[16, TOKENS, 16])
    if WARPS == 8:
        word_l: gl.constexpr = WORD_L8
    else:
        word_l: gl.constexpr = WORD_L4
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_l, k_width=2)
    pair_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=1)
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    flat_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    zero = gl.zeros([BN, TOKENS], gl.float32, acc_l)
    cols = gl.arange(0, TOKENS, layout=col_l)
    it = 0
    if MMA == MMA_STREAM:
        # Timing only: each slot released unread (the copies' own ceiling).
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            for g0 in range(0, n_groups, GPS):
                slot = it % STAGES
                mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
                mbarrier.arrive(empty.index(slot), count=1)
                it += 1
        return
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        acc = gl.zeros([BN, TOKENS], gl.float32, acc_l)
        for g0 in range(0, n_groups, GPS):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            if X_MODE == X_CPASYNC and (MMA == MMA_WGMMA or MMA == MMA_NODECODE):
                # cp.async wrote the slot through the generic proxy; the wgmma reads it through the async one.
                fence_async_shared()
            for j in gl.static_range(GPS):
                buf = slot * GPS + j
                words = codes.index(buf)._reinterpret(gl.int32, [BN, WORDS_PER_ROW], CODE_SL).load(word_l)
                so = scales.index(buf)._reinterpret(gl.int32, [BN], flat_sl).load(row_l)  # fp16 s | o << 16
                if X_MODE == X_SWZ128:
                    x_view = xs.index(buf)._reinterpret(gl.float16, [BK, BM], X_LAYOUT)
                elif TOKENS == 8:
                    x_view = xs.index(buf).permute([1, 0])  # [BK, 8] of the K-major slot
                else:
                    x_view = xs.index(buf)
                xsum = gl.load(xsum_ptr + (g0 + j) * TOKENS + cols)  # 2^-24 sum(x), from the L1
                a = _decode4(words, pair_l, a_l, MMA != MMA_NODECODE)
                if MMA == MMA_SYNC:
                    # mma.sync m16n8k16: B from registers (every warp reads all of it).
                    part = mma_v2(a, x_view.load(b_l), zero)
                elif MMA == MMA_NONE:
                    # Timing only: no product; a store that never runs keeps the decode.
                    if tile < 0:
                        gl.store(out_ptr + gl.arange(0, BN, layout=gl.SliceLayout(1, a_l))[:, None] * BK +
                                 gl.arange(0, BK, layout=gl.SliceLayout(0, a_l))[None, :], a.to(gl.float32))
                    part = zero
                else:
                    part = warpgroup_mma(a, x_view, zero, use_acc=False)
                if j == GPS - 1:
                    if X_MODE != X_CPASYNC:
                        # The slot's generic reads are ordered before the
                        # producer's next TMA write into it (cp.async writes
                        # are generic too).
                        fence_async_shared()
                    mbarrier.arrive(empty.index(slot), count=1)
                s, o = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [so],
                                                 dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
                acc += part * s.to(gl.float32)[:, None] + o.to(gl.float32)[:, None] * xsum[None, :]
            it += 1
        rows = tile * BN + gl.arange(0, BN, layout=row_l)
        gl.store(out_ptr + rows[:, None] * TOKENS + cols[None, :], acc * SUBNORMAL_SCALE)


@gluon.jit
def _ws_kernel(codes_desc, scales_desc, x_desc, xsum_ptr, out_ptr, n_tiles, n_groups, x_copies, STAGES: gl.constexpr,
               PRODUCER_REGS: gl.constexpr, MMA: gl.constexpr, X_MODE: gl.constexpr, GPS: gl.constexpr,
               WARPS: gl.constexpr, TOKENS: gl.constexpr):
    # WARPS: the consumer's (the launch's num_warps; the producer adds its
    # own). TOKENS: the tile's (gluon_ws_layout.TOKEN_TILES; 8 only with cpasync).
    if X_MODE == X_SWZ128:
        codes = gl.allocate_shared_memory(gl.int32, [STAGES, WIDE_CODE_ROWS, SWZ128_WORDS], WIDE_LAYOUT)
        scales = gl.allocate_shared_memory(gl.int32, [STAGES, 1, BN], CODES_LAYOUT)
        xs = gl.allocate_shared_memory(gl.float16, [STAGES, X_WIDE_ROWS, 64], X_WIDE_LAYOUT)
    else:
        codes = gl.allocate_shared_memory(gl.int32, [STAGES * GPS, CODE_ROWS, 128], CODES_LAYOUT)
        scales = gl.allocate_shared_memory(gl.int32, [STAGES * GPS, 1, BN], CODES_LAYOUT)
        if TOKENS == 8:
            xs = gl.allocate_shared_memory(gl.float16, [STAGES * GPS, TOKENS, BK], X8_LAYOUT)
        else:
            xs = gl.allocate_shared_memory(gl.float16, [STAGES * GPS, BK, TOKENS], X_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        if X_MODE == X_CPASYNC:
            mbarrier.init(ready.index(i), count=CP_PRODUCER_THREADS)
        else:
            mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    if X_MODE == X_CPASYNC:
        # codes_desc, scales_desc, x_desc are plain pointers here.
        gl.warp_specialize([
            (_consumer, (codes, scales, xs, ready, empty, xsum_ptr, out_ptr, n_tiles, n_groups, STAGES, MMA, X_MODE,
                          GPS, WARPS, TOKENS)),
            (_producer_cp, (codes_desc, scales_desc, x_desc, codes, scales, xs, ready, empty, n_tiles, n_groups,
                            STAGES, GPS, TOKENS)),
        ], [CP_PRODUCER_WARPS], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (codes, scales, xs, ready, empty, xsum_ptr, out_ptr, n_tiles, n_groups, STAGES, MMA, X_MODE,
                          GPS, WARPS, TOKENS)),
            (_producer, (codes_desc, scales_desc, x_desc, codes, scales, xs, ready, empty, n_tiles, n_groups,
                         x_copies, STAGES, X_MODE)),
        ], [1], [PRODUCER_REGS])
