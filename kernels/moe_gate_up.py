"""Launch 2 of the fused MoE layer (kernels/moe_mixed.py): per (expert slot,
BN rows of F, gate or up), the projection of the expert's tokens through the
block's pages at its own bitwidth; the second of each gate/up pair to finish
stores SiLU(gate) * up, rounded to fp16, as h in sorted order, in the three
activation planes the down launch's views read (weight_layout.plane_scales),
or for the CUDA-core tile quantized to int16 per span of 64 rows
(weight_layout.quantize_activations), with per-tile sums of h.

With MoeTiles.up_programs (the one-token tile) the same work runs as one
round of programs with equal shares by view cost, which cut row tiles' K
ranges into parts: the parts add into a zeroed fp32 accumulator and the part
that completes a row tile's gate and up stores h
(_moe_gate_up_shared_kernel)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import FP16_MAX, SPAN, actual_to_virtual, pair_position, plane_scale, quantize_spans
from kernels.moe_block_matmul import block_matmul_any
from kernels.moe_cuda_core import int16_row_pointers
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights, expert_blocks
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import MoeWorkspace, check_h_planes, counts_shape, settle_carveout, up_plan_width

_FP16_MAX_C = tl.constexpr(FP16_MAX)


@triton.jit
def _gate_up_tiles(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counters, h_ptr,
                   hq_scale_ptr, hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p,
                   top_k, q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    # Tokens [start, end) of the sorted list, BM at a time, through one
    # block's BN rows; per tile, the second of the gate/up pair to arrive
    # (counters[tile index]) combines SiLU(gate) * up.
    for m0 in range(start, end, BM):
        _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr,
                      counters + (m0 - start) // BM, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile,
                      which, H, F, pt_field_stride, log2p, top_k, q_x, q_h, BN, BM, USE_ASM)


@triton.jit
def _token_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, m0, end, H, top_k, BM: tl.constexpr):
    # The token tile from m0 of the sorted list: its positions [BM], which are
    # valid, and block_matmul's activation pointers (the planes' tile, the
    # group sums, the int16 span scales for BM 1).
    pos = m0 + tl.arange(0, BM)
    valid = pos < end
    flat = tl.load(sorted_ptr + pos, mask=valid, other=0)
    tok = (flat // top_k).to(tl.int64)
    xs_ptrs = xsum_ptr + tok * (H // 128)
    if BM == 1:
        tok1 = (tl.load(sorted_ptr + m0) // top_k).to(tl.int64)  # one token, valid (m0 < end)
        xt_ptrs, qs_ptrs = int16_row_pointers(xp_ptr, xq_scale_ptr, tok1, H)
    else:
        xt_ptrs = xp_ptr + tok[None, :] * H + tl.arange(0, 128)[:, None]
        qs_ptrs = xq_scale_ptr
    return pos, valid, xt_ptrs, xs_ptrs, qs_ptrs


@triton.jit
def _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counter, h_ptr,
                  hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p, top_k,
                  q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    pos, valid, xt_ptrs, xs_ptrs, qs_ptrs = _token_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, m0, end, H,
                                                        top_k, BM)
    acc = block_matmul_any(bf_nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, 0,
                           H // 128, log2p, xt_ptrs, valid[None, :], xs_ptrs, valid, 1, q_x, qs_ptrs,
                           1, BN, BM, USE_ASM)
    keep = (n < F)[:, None] & valid[None, :]
    pos64 = pos.to(tl.int64)
    mine = gu_ptr + (pos64[None, :] * 2 + which) * F + n[:, None]
    tl.store(mine, acc, mask=keep)
    tl.debug_barrier()
    if tl.atomic_add(counter, 1, sem="acq_rel") == 1:
        other = tl.load(gu_ptr + (pos64[None, :] * 2 + 1 - which) * F + n[:, None],
                        mask=keep, other=0.0, cache_modifier=".cg")
        gate = tl.where(which == 0, acc, other)
        up = tl.where(which == 0, other, acc)
        _store_h(gate, up, keep, valid, pos64, m0, n, col, tile, h_ptr, hq_scale_ptr, hsum_ptr, F, q_h,
                 BN, BM, USE_ASM)
        tl.atomic_xchg(counter, 0)


@triton.jit
def _store_h(gate, up, keep, valid, pos64, m0, n, col, tile, h_ptr, hq_scale_ptr, hsum_ptr, F, q_h,
             BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    # h = SiLU(gate) * up (fp32 [BN, BM]) of rows n, tokens pos64 (the tile
    # from m0) into the launch's outputs: h, its per-tile sums, and the planes
    # (fp16) or the int16 codes and span scales (BM 1).
    h = gate / (1.0 + tl.exp(-gate)) * up
    h16 = tl.minimum(tl.maximum(h, -_FP16_MAX_C), _FP16_MAX_C).to(tl.float16)
    tile_sum = tl.sum(tl.where(keep, h16.to(tl.float32), 0.0), axis=0)
    tl.store(hsum_ptr + pos64 * (F // BN) + tile, tile_sum, mask=valid)
    if BM == 1:
        # BN rows = BN / SPAN whole spans (F and BN are multiples of 64)
        q, scale = quantize_spans(tl.reshape(h16.to(tl.float32), (1, BN)), 1, BN)
        row = tl.cast(m0, tl.int64)
        tl.store(h_ptr + row * F + pair_position(n), tl.reshape(q, (BN,)))
        spans = tile * (BN // SPAN) + tl.arange(0, BN // SPAN)
        tl.store(hq_scale_ptr + row * (F // SPAN) + spans, tl.reshape(scale, (BN // SPAN,)))
    else:
        tl.store(h_ptr + pos64[None, :] * F + col[:, None], h16, mask=keep)
        _store_scaled_planes(h_ptr, q_h, pos64, F, col, h16, keep, USE_ASM)


@triton.jit
def _store_scaled_planes(h_ptr, q_h, pos64, F, col, h16, keep, USE_ASM: tl.constexpr):
    # Planes 1 and 2 of h (q_h elements apart): h16 times 2^-p by virtual
    # position (powers of two: exact but for subnormals). The compiler hoisted
    # the per-row factors above the K loop, where they took registers that
    # every loop of the launch then lacked (local sm_90 SASS: 4-bit loop
    # 449 -> 466 instructions); a side-effecting copy of col pins them here.
    if USE_ASM:
        col = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [col], dtype=tl.int32,
                                        is_pure=False, pack=1)
    at = pos64[None, :] * F + col[:, None]
    h1 = (h16.to(tl.float32) * plane_scale(col % 128, 1)[:, None]).to(tl.float16)
    tl.store(h_ptr + q_h + at, h1, mask=keep)
    h2 = (h16.to(tl.float32) * plane_scale(col % 128, 2)[:, None]).to(tl.float16)
    tl.store(h_ptr + 2 * q_h + at, h2, mask=keep)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles"])
def _moe_gate_up_kernel(
    xp_ptr,  # [3, T, H] fp16, x in virtual in-group order: the activation planes (int16 [1, T, H]: BM 1)
    xq_scale_ptr,  # [T, H / 64] fp32 scales of the int16 x (BM 1)
    xsum_ptr,  # [T, H / 128] fp32 group sums of xp
    sorted_ptr,  # [T * top_k] int32 flat (token, slot) sorted by expert
    offsets_ptr,  # [E + 1] int32
    active_ptr,  # [E] int32 experts with tokens
    num_active_ptr,  # [1] int32
    arena_ptr,  # [num_pages * page_bytes / 4] int32 arena words
    pt_ptr,  # [num_blocks, 5, max_pages] int32 page table
    bf_ptr,  # [num_blocks] int32 resident field count per block
    gu_ptr,  # [T * top_k, 2, F] fp32 scratch: gate / up pre-activations
    count_ptr,  # [E, F / BN, m_tiles] int32 arrivals per tile, zero between launches
    h_ptr,  # [3, T * top_k, F] fp16 out, sorted, virtual in-group order: the planes (int16 [1, ...]: BM 1)
    hq_scale_ptr,  # [T * top_k, F / 64] fp32 out, scales of the int16 h (BM 1)
    hsum_ptr,  # [T * top_k, F / BN] fp32 out, per-tile sums of h
    block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
    q_x, q_h,  # elements from one plane of xp (of h) to the next
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, USE_ASM: tl.constexpr,
):
    # Program (2 * tile + which, slot): rows [tile * BN, +BN) of the gate
    # (which = 0) or up (which = 1) block of the slot's expert, over the
    # expert's tokens in tiles of BM, or of BM_WIDE when the expert has more
    # than BM tokens (one pass over the weights instead of two; both programs
    # of a pair see the same count, so they take the same tiles).
    tile = tl.program_id(0) // 2
    which = tl.program_id(0) % 2
    slot = tl.program_id(1)
    if slot < tl.load(num_active_ptr):
        expert, blk, nf_g, nf_u, nf_d = expert_blocks(active_ptr, bf_ptr, slot, block0)
        if (nf_g > 0) & (nf_u > 0) & (nf_d > 0):
            nf = tl.where(which == 0, nf_g, nf_u)
            start = tl.load(offsets_ptr + expert)
            end = tl.load(offsets_ptr + expert + 1)
            n = tile * BN + tl.arange(0, BN)
            rows = tl.minimum(n, F - 1)
            pt_blk = pt_ptr + (blk + which).to(tl.int64) * pt_block_stride
            # Where row n of h goes: its virtual position inside its group.
            col = (n // 128) * 128 + actual_to_virtual(n % 128)
            counters = count_ptr + (expert * (F // BN) + tile) * m_tiles
            args = (xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, nf, gu_ptr, counters, h_ptr,
                    hq_scale_ptr, hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p,
                    top_k, q_x, q_h)
            if BM_WIDE > BM:  # compile time: this launch has a wide tile
                # The 16-token branch first: the compiler lays it out first, and
                # placed after the wide loops it ran 5-7 % slower with equal
                # loads (more no-instruction stalls; moe_narrow_first_*_h200.json).
                if end - start <= BM:
                    _gate_up_tiles(*args, BN, BM, USE_ASM)
                else:
                    _gate_up_tiles(*args, BN, BM_WIDE, USE_ASM)
            else:
                _gate_up_tiles(*args, BN, BM, USE_ASM)


# Relative time per weight group of each view (index = resident fields) in
# the one-token gate/up launch: the Mixtral B=1 layer's times per view
# (benchmarks/results/moe_h200_s14_b1.json: 2 / 3 / 4 / 6 / 8 bits at 67.7 /
# 73.8 / 81.3 / 98.1 / 115.3 us); index 0 (host-only) costs nothing.
ONE_TOKEN_GROUP_COST = (0, 68, 74, 81, 98, 115)
_COST1, _COST2, _COST3, _COST4, _COST5 = (tl.constexpr(c) for c in ONE_TOKEN_GROUP_COST[1:])


@triton.jit
def _one_token_cost(nf):
    return tl.where(nf == 1, _COST1, tl.where(nf == 2, _COST2, tl.where(
        nf == 3, _COST3, tl.where(nf == 4, _COST4, tl.where(nf >= 5, _COST5, 0)))))


@triton.jit
def _gate_up_part(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, offsets_ptr, active_ptr, arena_ptr, pt_ptr, bf_ptr,
                  gu_ptr, count_ptr, h_ptr, hq_scale_ptr, hsum_ptr, slot, which, tile, g0, g1, block0, H, F,
                  pt_block_stride, pt_field_stride, log2p, top_k, m_tiles, q_x, q_h,
                  BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    # Groups [g0, g1) (g0 < g1) of rows [tile BN, +BN) of the gate (which 0)
    # or up block of the expert in `slot`, all of its tokens, added into gu
    # (zero before the row tile's first part). The counter counts the row
    # tile's groups arrived, gate and up together: the part that completes
    # both (2 H / 128) reads them, zeroes them again, stores h and resets the
    # counter.
    expert, blk, nf_g, nf_u, nf_d = expert_blocks(active_ptr, bf_ptr, slot, block0)
    nf = tl.where(which == 0, nf_g, nf_u)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    n = tile * BN + tl.arange(0, BN)
    rows = tl.minimum(n, F - 1)
    pt_blk = pt_ptr + (blk + which).to(tl.int64) * pt_block_stride
    col = (n // 128) * 128 + actual_to_virtual(n % 128)
    counters = count_ptr + (expert * (F // BN) + tile) * m_tiles
    arrived = g1 - g0
    for m0 in range(start, end, BM):
        pos, valid, xt_ptrs, xs_ptrs, qs_ptrs = _token_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, m0, end,
                                                            H, top_k, BM)
        acc = block_matmul_any(nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, g0, g1, log2p, xt_ptrs,
                               valid[None, :], xs_ptrs, valid, 1, q_x, qs_ptrs, 1, BN, BM, USE_ASM)
        keep = (n < F)[:, None] & valid[None, :]
        pos64 = pos.to(tl.int64)
        gate_at = gu_ptr + (pos64[None, :] * 2) * F + n[:, None]
        tl.atomic_add(gate_at + which * F, acc, mask=keep, sem="relaxed")
        tl.debug_barrier()
        counter = counters + (m0 - start) // BM
        if tl.atomic_add(counter, arrived, sem="acq_rel") + arrived == 2 * (H // 128):
            gate = tl.load(gate_at, mask=keep, other=0.0, cache_modifier=".cg")
            up = tl.load(gate_at + F, mask=keep, other=0.0, cache_modifier=".cg")
            tl.store(gate_at, tl.zeros_like(gate), mask=keep)
            tl.store(gate_at + F, tl.zeros_like(up), mask=keep)
            _store_h(gate, up, keep, valid, pos64, m0, n, col, tile, h_ptr, hq_scale_ptr, hsum_ptr, F, q_h,
                     BN, BM, USE_ASM)
            tl.atomic_xchg(counter, 0)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles"])
def _moe_gate_up_shared_kernel(
    xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, arena_ptr, pt_ptr, bf_ptr,
    gu_ptr,  # [T * top_k, 2, F] fp32 gate / up accumulators, zero between launches (the launch re-zeroes them)
    count_ptr,  # [E, F / BN, m_tiles] int32 groups arrived per row tile, zero between launches
    h_ptr, hq_scale_ptr, hsum_ptr,
    plan_ptr,  # [programs, B_PAD] int32 scratch, one row per program
    block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles, q_x, q_h,
    BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, B_PAD: tl.constexpr,
):
    # The arguments as _moe_gate_up_kernel's. Block b = 2 slot + which (gate,
    # up) of the active experts has (F / BN) * (H / 128) steps (row tile,
    # group), tile-major, each weighted by its view's cost
    # (ONE_TOKEN_GROUP_COST); the blocks' steps laid end to end, program p
    # takes the steps whose first unit falls in [p total / P, (p + 1) total /
    # P): one round of equal shares, each a few row-tile parts.
    pid = tl.program_id(0)
    n_groups = H // 128
    steps = (F // BN) * n_groups
    n_act = tl.load(num_active_ptr)
    b = tl.arange(0, B_PAD)
    live = b // 2 < n_act
    blks = block0 + tl.load(active_ptr + b // 2, mask=live, other=0) * 3
    nf_g = tl.load(bf_ptr + blks, mask=live, other=0)
    nf_u = tl.load(bf_ptr + blks + 1, mask=live, other=0)
    nf_d = tl.load(bf_ptr + blks + 2, mask=live, other=0)
    resident = live & (nf_g > 0) & (nf_u > 0) & (nf_d > 0)
    unit = tl.where(resident, _one_token_cost(tl.where(b % 2 == 0, nf_g, nf_u)), 0)  # [B_PAD]
    # Through this program's plan row and back as uniform loads, as in the
    # down launch's shared split (kernels/moe_down.py says why).
    plan = plan_ptr + pid.to(tl.int64) * B_PAD
    tl.store(plan + b, tl.cumsum(unit * steps, axis=0))
    tl.debug_barrier()
    for blk in range(0, 2 * n_act):
        total = tl.load(plan + B_PAD - 1).to(tl.int64)
        lo = (pid * total // tl.num_programs(0)).to(tl.int32)
        hi = ((pid + 1) * total // tl.num_programs(0)).to(tl.int32)
        begin = tl.load(plan + blk - 1, mask=blk > 0, other=0)
        finish = tl.load(plan + blk)
        c = (finish - begin) // steps
        if (c > 0) & (finish > lo) & (begin < hi):
            # steps j whose first unit begin + j c lies in [lo, hi)
            j0 = tl.maximum(lo - begin + c - 1, 0) // c
            j1 = tl.minimum(tl.maximum(hi - begin + c - 1, 0) // c, steps)
            for tile in range(j0 // n_groups, (j1 + n_groups - 1) // n_groups):
                g0 = tl.maximum(j0 - tile * n_groups, 0)
                g1 = tl.minimum(j1 - tile * n_groups, n_groups)
                _gate_up_part(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, offsets_ptr, active_ptr, arena_ptr,
                              pt_ptr, bf_ptr, gu_ptr, count_ptr, h_ptr, hq_scale_ptr, hsum_ptr, blk // 2, blk % 2,
                              tile, g0, g1, block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
                              q_x, q_h, BN, BM, USE_ASM)



def run_gate_up(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int,
                top_k: int, ffn: int, tiles: MoeTiles, log2p: int) -> None:
    """Launch 2: ws.h, ws.hsum from ws.prep (after moe_prepare)."""
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    pt = weights.page_table
    if ws.counts.shape != counts_shape(t, top_k, ffn, num_experts, tiles):
        raise ValueError("workspace was allocated for other tiles")
    if ws.up_plan.shape != (tiles.up_programs, up_plan_width(num_experts)):
        raise ValueError("workspace was allocated for other tiles")
    check_h_planes(ws, tiles)
    args = (ws.prep.xp, ws.prep.xq_scale, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
            ws.prep.num_active, weights.storage.view(torch.int32), pt, weights.block_fields,
            ws.gu, ws.counts, ws.h, ws.hq_scale, ws.hsum)
    block0 = layer * num_experts * PROJS_PER_EXPERT
    if tiles.up_programs:
        kernel = _moe_gate_up_shared_kernel[(tiles.up_programs,)](
            *args, ws.up_plan, block0, hidden, ffn, pt.stride(0), pt.stride(1), log2p, top_k, ws.counts.shape[2],
            ws.prep.xp.numel(), ws.h.numel(),
            BN=tiles.block_n_up, BM=tiles.block_m, USE_ASM=tiles.use_asm, B_PAD=up_plan_width(num_experts),
            **tiles.launch_options(),
        )
    else:
        kernel = _moe_gate_up_kernel[(2 * (ffn // tiles.block_n_up), slots)](
            *args, block0, hidden, ffn, pt.stride(0), pt.stride(1), log2p, top_k, ws.counts.shape[2],
            ws.prep.xp.numel(), ws.h.numel(),
            BN=tiles.block_n_up, BM=tiles.block_m, BM_WIDE=tiles.block_m_wide, USE_ASM=tiles.use_asm,
            **tiles.launch_options(),
        )
    settle_carveout(ws, kernel, tiles)
