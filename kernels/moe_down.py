"""Launch 3 of the fused MoE layer (kernels/moe_mixed.py): the down
projection of h through each expert's down block at its own bitwidth, times
the routing weight, atomically added into out [T, H] fp32 (the weighted sum
over the top-k and over the K split in one go)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_block_matmul import block_matmul_any, rows_of_tile
from kernels.moe_cuda_core import int16_row_pointers
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights, slot_expert, token_class_bounds
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import DOWN_PLAN_FIELDS, MoeWorkspace, check_h_planes, down_plan_width, \
    launch_by_token_class, settle_carveout
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.weight_layout import GROUP


@triton.jit
def _down_tiles(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, start, end,
                n, rows, g0, g1, H, F, pt_field_stride, log2p, top_k, q_x,
                BN: tl.constexpr, BM: tl.constexpr, HS_SUB: tl.constexpr, USE_ASM: tl.constexpr,
                STAGES: tl.constexpr, ACT_CG: tl.constexpr):
    # Tokens [start, end), BM at a time, through BN rows of the down block
    # over groups [g0, g1), weighted and added into out.
    for m0 in range(start, end, BM):
        _down_tile(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, m0, end,
                   n, rows, g0, g1, H, F, pt_field_stride, log2p, top_k, q_x, BN, BM, HS_SUB, USE_ASM, STAGES,
                   ACT_CG)


@triton.jit
def _down_tile(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, m0, end,
               n, rows, g0, g1, H, F, pt_field_stride, log2p, top_k, q_x,
               BN: tl.constexpr, BM: tl.constexpr, HS_SUB: tl.constexpr, USE_ASM: tl.constexpr,
               STAGES: tl.constexpr, ACT_CG: tl.constexpr):
    m = tl.arange(0, BM)
    kv = tl.arange(0, 128)  # the planes hold each group in the decode's column order (slot order)
    pos = m0 + m
    valid = pos < end
    pos64 = pos.to(tl.int64)
    if BM == 1:
        # one token, valid (m0 < end)
        xt_ptrs, qs_ptrs = int16_row_pointers(h_ptr, hq_scale_ptr, tl.cast(m0, tl.int64), F)
    else:
        xt_ptrs = h_ptr + pos64[None, :] * F + kv[:, None]
        qs_ptrs = hq_scale_ptr
    xs_ptrs = hsum_ptr + pos64 * (F // 128 * HS_SUB)
    rows = rows_of_tile(rows, m0)
    acc = block_matmul_any(nf_d, arena_ptr, pt_down, pt_field_stride, H, F, rows, g0, g1,
                           log2p, xt_ptrs, valid[None, :], xs_ptrs, valid, HS_SUB, q_x, qs_ptrs,
                           HS_SUB, BN, BM, USE_ASM, STAGES, ACT_CG)
    flat = tl.load(sorted_ptr + pos, mask=valid, other=0)
    tok = (flat // top_k).to(tl.int64)
    wt = tl.load(tw_ptr + flat, mask=valid, other=0.0)
    keep = (n < H)[:, None] & valid[None, :]
    tl.atomic_add(out_ptr + tok[None, :] * H + n[:, None], acc * wt[None, :], mask=keep, sem="relaxed")


DOWN_PLAN_FIELDS_C = tl.constexpr(DOWN_PLAN_FIELDS)
PROJS_PER_EXPERT_C = tl.constexpr(PROJS_PER_EXPERT)


@triton.jit
def _group_cost(nf, COSTS: tl.constexpr):
    # COSTS: MoeTiles.down_cost_word, the cost of a group at f fields in byte
    # f - 1; an absent block (0 fields) costs nothing.
    return tl.where(nf == 1, COSTS & 255, tl.where(nf == 2, (COSTS >> 8) & 255, tl.where(
        nf == 3, (COSTS >> 16) & 255, tl.where(nf == 4, (COSTS >> 24) & 255, tl.where(
            nf >= 5, (COSTS >> 32) & 255, 0)))))


@triton.jit
def _zigzag(COSTS: tl.constexpr):
    # COSTS: MoeTiles.down_cost_word, down_zigzag in bit 40 (after the five views' bytes).
    return (COSTS >> 40) & 1


@triton.jit
def _plan_order(e, live, n_act, work, ZIGZAG: tl.constexpr):
    # -> (position of each slot in the row tile's work laid end to end, the
    # running sum of work there), both [E_PAD]. Slots come costliest first
    # (moe_align); with ZIGZAG the live ones alternate from both ends
    # (costliest, cheapest, second costliest, ...), so that with two views
    # in equal numbers every other expert end meets a share's end.
    if ZIGZAG:
        half = (n_act + 1) // 2
        pos = tl.where(e < half, 2 * e, tl.where(live, 2 * (n_act - 1 - e) + 1, e))  # a permutation of e
        # [E_PAD, E_PAD]: slot j's work counts toward slot e's end when j sits at or before e
        ends = tl.sum(tl.where(pos[None, :] <= pos[:, None], work[None, :], 0), axis=1)
    else:
        pos = e
        ends = tl.cumsum(work, axis=0)
    return pos, ends


@triton.jit
def _down_segment(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_ptr, out_ptr, blk, nf_d,
                  start, end, g0, g1, n, rows, H, F, pt_block_stride, pt_field_stride, log2p, top_k,
                  q_x, BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, HS_SUB: tl.constexpr,
                  USE_ASM: tl.constexpr, STAGES: tl.constexpr, STAGES_WIDE: tl.constexpr, ACT_CG: tl.constexpr):
    # Groups [g0, g1) of the down block of the expert whose first block is
    # blk (its three blocks resident), rows n, its tokens [start, end).
    pt_down = pt_ptr + (blk + 2).to(tl.int64) * pt_block_stride
    args = (h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, start, end,
            n, rows, g0, g1, H, F, pt_field_stride, log2p, top_k, q_x)
    if BM_WIDE > BM:  # compile time, as in the gate/up launch (narrow first)
        if end - start <= BM:
            _down_tiles(*args, BN, BM, HS_SUB, USE_ASM, STAGES, ACT_CG)
        else:
            _down_tiles(*args, BN, BM_WIDE, HS_SUB, USE_ASM, STAGES_WIDE, ACT_CG)
    else:
        _down_tiles(*args, BN, BM, HS_SUB, USE_ASM, STAGES, ACT_CG)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "split", "groups_per_split"])
def _moe_down_kernel(
    h_ptr,  # [3, T * top_k, F] fp16, sorted, in the slot order of BM: the planes (int16 [1, ...]: BM 1)
    hq_scale_ptr,  # [T * top_k, F / 64] fp32 scales of the int16 h (BM 1)
    hsum_ptr,  # [T * top_k, F / min(BN_UP, 128)] fp32 sums of h (MoeTiles.h_sum_rows)
    sorted_ptr,  # [T * top_k] int32 flat (token, slot) sorted by expert
    offsets_ptr,  # [E + 1] int32
    active_ptr,  # [E] int32
    num_active_ptr,  # [1] int32
    tw_ptr,  # [T * top_k] fp32 routing weights
    arena_ptr,  # int32 arena words
    pt_ptr,  # [num_blocks, 5, max_pages] int64 page offsets (docs/WEIGHT_LAYOUT.md)
    bf_ptr,  # [num_blocks] int32
    out_ptr,  # [T, H] fp32, accumulated into (zeroed by moe_prepare)
    plan_ptr,  # [programs, DOWN_PLAN_FIELDS * E_PAD] int32 scratch, one row per program (BALANCE only)
    block0, E, H, F, pt_block_stride, pt_field_stride, log2p, split, groups_per_split, top_k,
    q_x,  # element offset of the second plane of h
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, HS_SUB: tl.constexpr,
    USE_ASM: tl.constexpr, E_PAD: tl.constexpr, BALANCE: tl.constexpr, PDL: tl.constexpr,
    STAGES: tl.constexpr,  # pipeline depth of the BM loops (MoeTiles.num_stages)
    STAGES_WIDE: tl.constexpr,  # of the BM_WIDE loops (MoeTiles.wide_loop_stages)
    DOWN_COSTS: tl.constexpr,  # MoeTiles.down_cost_word (BALANCE only)
    TOKENS_LO: tl.constexpr = 0,  # only experts of over TOKENS_LO tokens (0: no bound; not with BALANCE)
    TOKENS_HI: tl.constexpr = 0,  # only experts of at most TOKENS_HI tokens (0: no bound)
):
    # Program (n, p): down_program, which waits for the gate/up launch
    # after its routing loads (the entry's tables, two launches back).
    down_program(tl.program_id(0), tl.program_id(1), tl.num_programs(1), h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr,
                 offsets_ptr, active_ptr, num_active_ptr, tw_ptr, arena_ptr, pt_ptr, bf_ptr, out_ptr, plan_ptr,
                 plan_ptr, block0, E, H, F, pt_block_stride, pt_field_stride, log2p, split, groups_per_split, top_k,
                 q_x, BN, BM, BM_WIDE, HS_SUB, USE_ASM, E_PAD, BALANCE, STAGES, STAGES_WIDE, False, PDL, DOWN_COSTS,
                 TOKENS_LO, TOKENS_HI)


@triton.jit
def down_program(pid_n, pid_p, num_p, h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, offsets_ptr, active_ptr,
                 num_active_ptr, tw_ptr, arena_ptr, pt_ptr, bf_ptr, out_ptr, plan_ptr, ready_ptr, block0, E, H, F,
                 pt_block_stride, pt_field_stride, log2p, split, groups_per_split, top_k, q_x,
                 BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, HS_SUB: tl.constexpr,
                 USE_ASM: tl.constexpr, E_PAD: tl.constexpr, BALANCE: tl.constexpr, STAGES: tl.constexpr,
                 STAGES_WIDE: tl.constexpr, WAIT: tl.constexpr, PDL: tl.constexpr, DOWN_COSTS: tl.constexpr,
                 TOKENS_LO: tl.constexpr = 0, TOKENS_HI: tl.constexpr = 0):
    """One program of the down launch (arguments as _moe_down_kernel's),
    program (pid_n, pid_p) of num_p per row tile. With WAIT, h is written by
    other programs of the same launch (kernels/moe_gate_up_down.py): before
    each range of groups the program waits until ready_ptr[expert * (F /
    BN_UP) + tile] counts every token tile of the expert for each of the
    range's h tiles (HS_SUB tiles a group), and reads the activation sums and
    scales through the L2; without, ready_ptr is not touched. With PDL the
    program loads the routing tables (num_active, the slots' experts, their
    field counts and token ranges: the MoE entry's, two launches back, and
    the weight store's) through the L2, then waits for the previous grid
    (kernels/pdl.py), so that their round trips overlap the gate/up
    launch's last programs; the caller must not have waited.
    TOKENS_LO / TOKENS_HI (0: no bound; without BALANCE only): the program
    works only for an expert of over TOKENS_LO and at most TOKENS_HI tokens
    (MoeTiles.down_split_stages)."""
    # Program (n, p) of split programs per expert slot: rows [n BN, +BN) of
    # the down blocks. Without BALANCE: slot p // split, K range p % split of
    # groups_per_split groups. With BALANCE: share p of the row tile's work,
    # which is the active experts' groups laid end to end, each group weighted
    # by its view's cost (DOWN_COSTS), the experts in the order of
    # _plan_order; the program takes the groups whose first unit falls in
    # [p total / P, (p + 1) total / P). With equal views
    # that is the same split; with mixed views a program may finish one
    # expert's range and start the next, instead of the launch waiting on the
    # slowest views' programs.
    n_groups = F // 128
    n_act = tl.load(num_active_ptr, cache_modifier=".cg")
    n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(n, H - 1)
    if BALANCE:
        # Every load here waits on at most the active ids (see slot_expert);
        # plan slots past E read slot E - 1 again and, like all past n_act, get no work.
        e = tl.arange(0, E_PAD)
        _, blks, nf_g, nf_u, nf_d, starts, ends = slot_expert(active_ptr, bf_ptr, offsets_ptr,
                                                              tl.minimum(e, E - 1), block0, E)
        wait_for_previous_grid(PDL)
        live = e < n_act
        unit = tl.where(live & (nf_g > 0) & (nf_u > 0), _group_cost(nf_d, DOWN_COSTS), 0)  # [E_PAD]
        work = unit * n_groups  # [E_PAD]
        # The slots' work ends and tables go through this program's row of
        # plan and come back as loads from uniform addresses: values taken
        # from the reduction directly are per-thread to ptxas, and an expert
        # slot or a group range derived from them made every K loop re-derive
        # its addresses (Triton 3.6 SASS: 4-bit loop 434 -> 545 instructions,
        # 224 bytes of spills; measured +18 % on the down launch). Row: work
        # ends | first block | down fields | start | end, E_PAD each.
        plan = plan_ptr + (pid_n * num_p + pid_p).to(tl.int64) * (DOWN_PLAN_FIELDS_C * E_PAD)
        pos, work_ends = _plan_order(e, live, n_act, work, _zigzag(DOWN_COSTS))
        tl.store(plan + pos, work_ends)
        tl.store(plan + E_PAD + pos, blks)
        tl.store(plan + 2 * E_PAD + pos, nf_d)
        tl.store(plan + 3 * E_PAD + pos, starts)
        tl.store(plan + 4 * E_PAD + pos, ends)
        tl.debug_barrier()
        for slot in range(0, n_act):
            # The share's bounds are reloaded per slot, not carried across
            # the K loops (the 3.6 SASS is the same either way).
            total = tl.load(plan + E_PAD - 1).to(tl.int64)
            lo = (pid_p * total // num_p).to(tl.int32)
            hi = ((pid_p + 1) * total // num_p).to(tl.int32)
            begin = tl.load(plan + slot - 1, mask=slot > 0, other=0)
            finish = tl.load(plan + slot)
            c = (finish - begin) // n_groups  # 0: not active, or a block absent
            if (c > 0) & (finish > lo) & (begin < hi):
                # groups whose first unit begin + g c lies in [lo, hi)
                g0 = tl.maximum(lo - begin + c - 1, 0) // c
                g1 = tl.minimum(tl.maximum(hi - begin + c - 1, 0) // c, n_groups)
                if g0 < g1:
                    blk = tl.load(plan + E_PAD + slot)
                    start = tl.load(plan + 3 * E_PAD + slot)
                    end = tl.load(plan + 4 * E_PAD + slot)
                    if WAIT:
                        _wait_for_h(ready_ptr, (blk - block0) // PROJS_PER_EXPERT_C, start, end, g0, g1, F, BM, HS_SUB)
                    _down_segment(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_ptr, out_ptr,
                                  blk, tl.load(plan + 2 * E_PAD + slot), start, end, g0, g1, n,
                                  rows, H, F, pt_block_stride, pt_field_stride, log2p, top_k, q_x, BN, BM,
                                  BM_WIDE, HS_SUB, USE_ASM, STAGES, STAGES_WIDE, WAIT)
    else:
        slot = pid_p // split  # < E: the grid has split programs per slot
        g0 = (pid_p % split) * groups_per_split
        g1 = tl.minimum(g0 + groups_per_split, n_groups)
        expert, blk, nf_g, nf_u, nf_d, start, end = slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E)
        wait_for_previous_grid(PDL)
        lo, hi = token_class_bounds(start, end, TOKENS_LO, TOKENS_HI)
        # One condition on every loaded value (as in the gate/up launch).
        if (slot < n_act) & (g0 < g1) & (nf_g > 0) & (nf_u > 0) & (nf_d > 0) & (lo < end) & (end <= hi):
            if WAIT:
                _wait_for_h(ready_ptr, expert, start, end, g0, g1, F, BM, HS_SUB)
            _down_segment(h_ptr, hq_scale_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_ptr, out_ptr, blk, nf_d,
                          start, end, g0, g1, n, rows, H, F, pt_block_stride, pt_field_stride, log2p, top_k, q_x,
                          BN, BM, BM_WIDE, HS_SUB, USE_ASM, STAGES, STAGES_WIDE, WAIT)


# h tiles polled at once by _wait_for_h (a power of two).
_READY_CHUNK = tl.constexpr(32)


@triton.jit
def _wait_for_h(ready_ptr, expert, start, end, g0, g1, F, BM: tl.constexpr, HS_SUB: tl.constexpr):
    # Until every h tile of groups [g0, g1) of the expert counts all its
    # token tiles (tokens [start, end), BM a tile): polled by volatile loads
    # (from the L2, no atomic traffic while the producers add), then taken
    # with acquire atomics, whose ordering the barrier extends to every
    # thread's later reads.
    target = (end - start + BM - 1) // BM
    tiles = ready_ptr + expert * (F // 128 * HS_SUB)
    for t0 in range(g0 * HS_SUB, g1 * HS_SUB, _READY_CHUNK):
        t = t0 + tl.arange(0, _READY_CHUNK)
        live = t < g1 * HS_SUB
        while _tiles_short(tiles + t, live, target) > 0:
            pass
        tl.atomic_add(tiles + t, 0, mask=live, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _tiles_short(ptrs, live, target):
    # How many of the live counts are still below target (volatile: from the L2).
    return tl.sum((tl.load(ptrs, mask=live, other=target, volatile=True) < target).to(tl.int32), axis=0)


def down_launch_shape(ws: MoeWorkspace, tiles: MoeTiles, num_experts: int, top_k: int,
                      ffn: int) -> tuple[int, int, int, int]:
    """(row tiles, programs per row tile, K split, groups per split) of the
    down programs for ws's tokens, after checking ws's plan rows against
    them (run_down, kernels/moe_gate_up_down.py)."""
    t, hidden = ws.prep.xp.shape
    row_tiles, progs_per_tile = tiles.down_grid(t, top_k, num_experts, hidden, ffn)
    if ws.down_plan.shape != (row_tiles * progs_per_tile, DOWN_PLAN_FIELDS * down_plan_width(num_experts)):
        raise ValueError("workspace was allocated for other tiles")
    split = progs_per_tile // min(num_experts, t * top_k)
    return row_tiles, progs_per_tile, split, triton.cdiv(ffn // GROUP, split)


def run_down(ws: MoeWorkspace, topk_weights: torch.Tensor, weights: PagedWeights, layer: int,
             num_experts: int, top_k: int, ffn: int, tiles: MoeTiles, log2p: int,
             pdl: PdlPolicy = DEFAULT_PDL) -> None:
    """Launch 3: accumulates ws.prep.out from ws.h (after run_gate_up); pdl: kernels/pdl.py.
    With tiles.down_split_stages, two launches by token class at once, as
    run_gate_up's split (moe_workspace.launch_by_token_class)."""
    shape = down_launch_shape(ws, tiles, num_experts, top_k, ffn)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    check_h_planes(ws, tiles)
    launch_by_token_class(ws, tiles, tiles.down_split_stages, lambda *tile_class: _launch_down(
        ws, tw, weights, layer, num_experts, top_k, ffn, tiles, log2p, pdl, shape, *tile_class))


def _launch_down(ws: MoeWorkspace, tw: torch.Tensor, weights: PagedWeights, layer: int, num_experts: int,
                 top_k: int, ffn: int, tiles: MoeTiles, log2p: int, pdl: PdlPolicy,
                 shape: tuple[int, int, int, int], block_m: int, block_m_wide: int, stages: int,
                 wide_stages: int, tokens_lo: int, tokens_hi: int) -> None:
    # One down launch (shape: down_launch_shape's) of token tile block_m (and
    # block_m_wide) for the experts of over tokens_lo and at most tokens_hi
    # tokens (0: no bound).
    t, hidden = ws.prep.xp.shape
    row_tiles, progs_per_tile, split, groups_per_split = shape
    pt = weights.page_table
    kernel = _moe_down_kernel[(row_tiles, progs_per_tile)](
        ws.h, ws.hq_scale, ws.hsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active, ws.prep.num_active,
        tw, weights.storage.view(torch.int32), pt, weights.block_fields, ws.prep.out, ws.down_plan,
        layer * num_experts * PROJS_PER_EXPERT, num_experts, hidden, ffn, pt.stride(0), pt.stride(1), log2p,
        split, groups_per_split, top_k, ws.h.numel(),
        BN=tiles.block_n_down, BM=block_m, BM_WIDE=block_m_wide,
        HS_SUB=GROUP // tiles.h_sum_rows, USE_ASM=tiles.use_asm,
        E_PAD=down_plan_width(num_experts), BALANCE=tiles.balance_down, STAGES=stages,
        STAGES_WIDE=wide_stages, DOWN_COSTS=tiles.down_cost_word, TOKENS_LO=tokens_lo, TOKENS_HI=tokens_hi,
        **tiles.launch_options(stages), **pdl_options(ws.h.device, t, pdl),
    )
    settle_carveout(ws, kernel, tiles, by_registers=tiles.down_by_registers)
