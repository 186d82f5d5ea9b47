"""Launch 2 of the fused MoE layer (kernels/moe_mixed.py): per (expert slot,
BN rows of F, gate or up), the projection of the expert's tokens through the
block's pages at its own bitwidth; the second of each gate/up pair to finish
stores SiLU(gate) * up, rounded to fp16, as h in sorted order, in the three
activation planes the down launch's views read (weight_layout.plane_scales),
or for the CUDA-core tile quantized to int16 per span of 64 rows
(weight_layout.quantize_activations), with per-tile sums of h."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import FP16_MAX, SPAN, actual_to_virtual, pair_position, plane_scale, quantize_spans
from kernels.moe_block_matmul import block_matmul_any
from kernels.moe_cuda_core import int16_row_pointers
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights, slot_expert
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import MoeWorkspace, check_h_planes, counts_shape, settle_carveout
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

_FP16_MAX_C = tl.constexpr(FP16_MAX)


@triton.jit
def _gate_up_tiles(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counters, h_ptr,
                   hq_scale_ptr, hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p,
                   top_k, q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
                   STAGES: tl.constexpr, g0, g1, PARTIAL: tl.constexpr):
    # Tokens [start, end) of the sorted list, BM at a time, through one
    # block's BN rows over groups [g0, g1); per tile, the arrival that
    # completes the gate/up pair (counters[tile index]) combines SiLU(gate) * up.
    for m0 in range(start, end, BM):
        _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr,
                      counters + (m0 - start) // BM, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile,
                      which, g0, g1, H, F, pt_field_stride, log2p, top_k, q_x, q_h, BN, BM, USE_ASM, STAGES,
                      PARTIAL)


@triton.jit
def _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counter, h_ptr,
                  hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile, which, g0, g1, H, F, pt_field_stride, log2p,
                  top_k, q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, STAGES: tl.constexpr,
                  PARTIAL: tl.constexpr):
    # Groups [g0, g1) of the gate (which = 0) or up block's rows n for
    # tokens [m0, m0 + BM). Whole (PARTIAL False): this program's product is
    # the tile's, stored; the second of the pair to arrive (counter) combines.
    # PARTIAL: the product of a share of the groups is added into gu, which
    # is zero between launches, and the counter counts groups; the share that
    # completes both projections' 2 H / 128 groups combines, then zeroes its
    # rows of gu again.
    m = tl.arange(0, BM)
    kv = tl.arange(0, 128)
    pos = m0 + m
    valid = pos < end
    flat = tl.load(sorted_ptr + pos, mask=valid, other=0)
    tok = (flat // top_k).to(tl.int64)
    xs_ptrs = xsum_ptr + tok * (H // 128)
    if BM == 1:
        tok1 = (tl.load(sorted_ptr + m0) // top_k).to(tl.int64)  # one token, valid (m0 < end)
        xt_ptrs, qs_ptrs = int16_row_pointers(xp_ptr, xq_scale_ptr, tok1, H)
    else:
        xt_ptrs = xp_ptr + tok[None, :] * H + kv[:, None]
        qs_ptrs = xq_scale_ptr
    acc = block_matmul_any(bf_nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, g0,
                           g1, log2p, xt_ptrs, valid[None, :], xs_ptrs, valid, 1, q_x, qs_ptrs,
                           1, BN, BM, USE_ASM, STAGES)
    keep = (n < F)[:, None] & valid[None, :]
    pos64 = pos.to(tl.int64)
    mine = gu_ptr + (pos64[None, :] * 2 + which) * F + n[:, None]
    if PARTIAL:
        tl.atomic_add(mine, acc, mask=keep, sem="relaxed")
        arrived = g1 - g0
        complete = 2 * (H // 128)
    else:
        tl.store(mine, acc, mask=keep)
        arrived = 1
        complete = 2
    tl.debug_barrier()
    if tl.atomic_add(counter, arrived, sem="acq_rel") + arrived == complete:
        other = tl.load(gu_ptr + (pos64[None, :] * 2 + 1 - which) * F + n[:, None],
                        mask=keep, other=0.0, cache_modifier=".cg")
        if PARTIAL:
            acc = tl.load(mine, mask=keep, other=0.0, cache_modifier=".cg")
            tl.store(mine, tl.zeros_like(acc), mask=keep)
            tl.store(gu_ptr + (pos64[None, :] * 2 + 1 - which) * F + n[:, None], tl.zeros_like(acc), mask=keep)
        gate = tl.where(which == 0, acc, other)
        up = tl.where(which == 0, other, acc)
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
        tl.atomic_xchg(counter, 0)


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
    block0, E, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
    q_x, q_h,  # elements from one plane of xp (of h) to the next
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr,
    STAGES: tl.constexpr,  # pipeline depth of the BM loops (MoeTiles.num_stages)
    STAGES_WIDE: tl.constexpr,  # of the BM_WIDE loops (MoeTiles.wide_loop_stages)
):
    # Program (2 * tile + which, slot): rows [tile * BN, +BN) of the gate
    # (which = 0) or up (which = 1) block of the slot's expert, over the
    # expert's tokens in tiles of BM, or of BM_WIDE when the expert has more
    # than BM tokens (one pass over the weights instead of two; both programs
    # of a pair see the same count, so they take the same tiles).
    wait_for_previous_grid(PDL)
    tile = tl.program_id(0) // 2
    which = tl.program_id(0) % 2
    slot = tl.program_id(1)
    n_act = tl.load(num_active_ptr)
    expert, blk, nf_g, nf_u, nf_d, start, end = slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E)
    # Every loaded value is tested in two conditions: the compiler would
    # otherwise sink each load below the branch before it, one round trip
    # after another. Not in one condition: with the slot test joined to the
    # others, ptxas gave the launch 255 registers instead of 225 and the
    # 8-bit one-token loop 406 instructions a step instead of 362 (local
    # Triton 3.6 sm_90, benchmarks/sass_loops.py).
    if slot < n_act:
        if (nf_g > 0) & (nf_u > 0) & (nf_d > 0) & (start < end):
            nf = tl.where(which == 0, nf_g, nf_u)
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
                    _gate_up_tiles(*args, BN, BM, USE_ASM, STAGES, 0, H // 128, False)
                else:
                    _gate_up_tiles(*args, BN, BM_WIDE, USE_ASM, STAGES_WIDE, 0, H // 128, False)
            else:
                _gate_up_tiles(*args, BN, BM, USE_ASM, STAGES, 0, H // 128, False)


# Relative time per weight group of each view (index = resident fields) in
# the one-token launches, from the Mixtral B=1 layer at 2 / 3 / 4 / 6 / 8
# bits (benchmarks/results/moe_h200_s20.json: 34.8 / 46.0 / 54.8 / 67.1 /
# 75.3 % of the copy bandwidth over bytes of 2.25 / 3.25 / 4.25 / 6.25 / 8.25
# bits a weight with the scales); index 0 (host-only) costs nothing.
ONE_TOKEN_GROUP_COST = (0, 8, 9, 10, 12, 14)
_OT1, _OT2, _OT3, _OT4, _OT5 = (tl.constexpr(c) for c in ONE_TOKEN_GROUP_COST[1:])


@triton.jit
def _one_token_group_cost(nf):
    return tl.where(nf == 1, _OT1, tl.where(nf == 2, _OT2, tl.where(
        nf == 3, _OT3, tl.where(nf == 4, _OT4, tl.where(nf >= 5, _OT5, 0)))))


@triton.jit
def _slot_work(active_ptr, bf_ptr, offsets_ptr, slot, block0, E, n_groups, row_tiles):
    # One slot's tables and its cost units (0 unless its three blocks are
    # resident and it has tokens): row tiles x (gate's groups + up's), each
    # group weighted by its view (_one_token_group_cost).
    expert, blk, nf_g, nf_u, nf_d, start, end = slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E)
    cost_g = _one_token_group_cost(nf_g)
    cost_u = _one_token_group_cost(nf_u)
    ok = (nf_g > 0) & (nf_u > 0) & (nf_d > 0) & (start < end)
    units = tl.where(ok, row_tiles * n_groups * (cost_g + cost_u), 0)
    return expert, blk, nf_g, nf_u, cost_g, cost_u, start, end, units


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles"])
def _moe_gate_up_shared_kernel(
    xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, arena_ptr, pt_ptr, bf_ptr,
    gu_ptr,  # [T * top_k, 2, F] fp32 scratch, zero between launches (the combining share zeroes its rows)
    count_ptr,  # [E, F / BN, m_tiles] int32 groups arrived per tile, zero between launches
    h_ptr, hq_scale_ptr, hsum_ptr,
    block0, E, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles, q_x, q_h,
    BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
):
    # The one-token gate/up with its work shared evenly among a fixed number
    # of programs (MoeTiles.gate_up_programs: as many as are resident at
    # once): the active slots' (row tile, gate then up, group) laid end to
    # end, each group weighted by its view's cost; program p takes the groups
    # whose first unit falls in [p total / P, (p + 1) total / P). With one
    # program per (row tile, projection, slot) the launch ran as 1.7 waves.
    # Arguments as _moe_gate_up_kernel's.
    wait_for_previous_grid(PDL)
    n_groups = H // 128
    row_tiles = F // BN
    n_act = tl.load(num_active_ptr)
    total = 0
    for slot in range(0, n_act):
        total += _slot_work(active_ptr, bf_ptr, offsets_ptr, slot, block0, E, n_groups, row_tiles)[8]
    programs = tl.num_programs(0)
    lo = (tl.program_id(0).to(tl.int64) * total // programs).to(tl.int32)
    hi = ((tl.program_id(0).to(tl.int64) + 1) * total // programs).to(tl.int32)
    begin = 0
    for slot in range(0, n_act):
        expert, blk, nf_g, nf_u, cost_g, cost_u, start, end, units = _slot_work(
            active_ptr, bf_ptr, offsets_ptr, slot, block0, E, n_groups, row_tiles)
        finish = begin + units
        if (units > 0) & (finish > lo) & (begin < hi):
            per_tile = n_groups * (cost_g + cost_u)
            first = tl.maximum(lo - begin, 0) // per_tile
            last = (tl.minimum(hi - begin, units) - 1) // per_tile
            for tile in range(first, last + 1):
                n = tile * BN + tl.arange(0, BN)
                rows = tl.minimum(n, F - 1)
                col = (n // 128) * 128 + actual_to_virtual(n % 128)
                counters = count_ptr + (expert * row_tiles + tile) * m_tiles
                tile_begin = begin + tile * per_tile
                for which in range(0, 2):
                    cost = tl.where(which == 0, cost_g, cost_u)
                    chunk = tile_begin + which * n_groups * cost_g
                    # groups whose first unit chunk + g cost lies in [lo, hi)
                    g0 = tl.minimum(tl.maximum(lo - chunk + cost - 1, 0) // cost, n_groups)
                    g1 = tl.minimum(tl.maximum(hi - chunk + cost - 1, 0) // cost, n_groups)
                    if g0 < g1:
                        pt_blk = pt_ptr + (blk + which).to(tl.int64) * pt_block_stride
                        _gate_up_tiles(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk,
                                       tl.where(which == 0, nf_g, nf_u), gu_ptr, counters, h_ptr, hq_scale_ptr,
                                       hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride,
                                       log2p, top_k, q_x, q_h, BN, BM, USE_ASM, STAGES, g0, g1, True)
        begin = finish


def run_gate_up(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int,
                top_k: int, ffn: int, tiles: MoeTiles, log2p: int, pdl: PdlPolicy = DEFAULT_PDL) -> None:
    """Launch 2: ws.h, ws.hsum from ws.prep (after moe_prepare); pdl: kernels/pdl.py."""
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    pt = weights.page_table
    if ws.counts.shape != counts_shape(t, top_k, ffn, num_experts, tiles):
        raise ValueError("workspace was allocated for other tiles")
    check_h_planes(ws, tiles)
    args = (ws.prep.xp, ws.prep.xq_scale, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
            ws.prep.num_active, weights.storage.view(torch.int32), pt, weights.block_fields,
            ws.gu, ws.counts, ws.h, ws.hq_scale, ws.hsum, layer * num_experts * PROJS_PER_EXPERT, num_experts,
            hidden, ffn, pt.stride(0), pt.stride(1), log2p, top_k, ws.counts.shape[2],
            ws.prep.xp.numel(), ws.h.numel())
    if tiles.gate_up_programs:
        kernel = _moe_gate_up_shared_kernel[(tiles.gate_up_programs,)](
            *args, BN=tiles.block_n_up, BM=tiles.block_m, USE_ASM=tiles.use_asm, STAGES=tiles.num_stages,
            **tiles.launch_options(), **pdl_options(ws.h.device, t, pdl))
    else:
        kernel = _moe_gate_up_kernel[(2 * (ffn // tiles.block_n_up), slots)](
            *args, BN=tiles.block_n_up, BM=tiles.block_m, BM_WIDE=tiles.block_m_wide,
            USE_ASM=tiles.use_asm, STAGES=tiles.num_stages, STAGES_WIDE=tiles.wide_loop_stages,
            **tiles.launch_options(), **pdl_options(ws.h.device, t, pdl))
    settle_carveout(ws, kernel, tiles)
