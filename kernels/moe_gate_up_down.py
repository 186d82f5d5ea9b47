"""Launches 2 and 3 of the fused MoE layer (kernels/moe_mixed.py) as one
launch, for the one-token tile (MoeTiles.one_launch).

Why: at B=1 (Mixtral) the gate/up launch is 448 programs on 264 resident
slots, so its second round leaves about a third of the slots idle while the
down launch waits for the whole of it; then the down launch starts from an
empty pipeline. Under ncu the gate/up launch's multiprocessors were busy
49 k / 77 k / 88 k cycles (min / mean / max) of 93 k (kernels/moe_gate_up.py).
In one launch the down programs take those slots as soon as the h tiles
they read are stored.

How: every program first takes a ticket (an atomic count), and the ticket,
not the program id, says which work it does: tickets [0, gate/up programs)
are gate/up programs (gate_up_program, tile-major, so that the low K ranges
of every expert are stored first), the rest down programs (down_program, in
order of K range). A gate/up pair's second program, after storing its h
tile, counts it in `ready` (release); a down program waits until every h
tile of its K range is counted (acquire), and reads the activation sums and
scales through the L2 (block_matmul's ACT_CG). Deadlock-free on any
schedule: a down program waits only on gate/up work whose tickets were all
taken before its own, that is by programs already resident, which never
wait. The last down program to finish hands the counters back zeroed (the
ArrivalCounters contract).

Measured slower than the two launches (-1.6 % end to end at 4 bits B=1,
kernels/moe_tuning_one_token.py ONE_TOKEN_ONE_LAUNCH), hence off by default. The
ticket's round trip at every program's start costs about 0.8 % of that (a
program-id-order probe without it: -0.9 %). Where the rest goes (the
waits, the down programs' done count, the L2-only activation reads) and why
filling the second round's free slots gains so little was not profiled. A
likely reason: a multiprocessor's idle slot is not idle bandwidth, since
the fewer gate/up programs of the second round each draw more of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_down import down_launch_shape, down_program
from kernels.moe_gate_up import gate_up_program
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import MoeWorkspace, check_h_planes, counts_shape, down_plan_width, ready_size, \
    settle_carveout
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.weight_layout import GROUP

# Counters zeroed per store by the last program (a power of two).
_ZERO_CHUNK = tl.constexpr(1024)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles", "slots", "gate_up_programs", "row_tiles",
                               "progs_per_tile", "split", "groups_per_split"])
def _moe_gate_up_down_kernel(
    xp_ptr, xq_scale_ptr, xsum_ptr,  # as _moe_gate_up_kernel's
    sorted_ptr, offsets_ptr, active_ptr, num_active_ptr,  # as both launches'
    arena_ptr, pt_ptr, bf_ptr,
    gu_ptr, count_ptr, h_ptr, hq_scale_ptr, hsum_ptr,  # as _moe_gate_up_kernel's
    tw_ptr, out_ptr, plan_ptr,  # as _moe_down_kernel's
    ready_ptr,  # [E * F / BN + 2] int32, zero between launches: h tiles stored, then tickets and programs done
    block0, E, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
    q_x, q_h,  # elements from one plane of xp (of h) to the next
    slots,  # expert slots of the gate/up programs
    gate_up_programs,  # 2 * (F / BN) * slots
    row_tiles, progs_per_tile, split, groups_per_split,  # the down launch's grid and K split
    BN: tl.constexpr, BM: tl.constexpr, HS_SUB: tl.constexpr, USE_ASM: tl.constexpr, E_PAD: tl.constexpr,
    BALANCE: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
    DOWN_COSTS: tl.constexpr,  # MoeTiles.down_cost_word (BALANCE only)
):
    wait_for_previous_grid(PDL)
    n_ready = E * (F // BN)
    ticket_ptr = ready_ptr + n_ready
    done_ptr = ticket_ptr + 1
    item = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    if item < gate_up_programs:
        pair = item // 2
        gate_up_program(pair // slots, item % 2, pair % slots, xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr,
                        offsets_ptr, active_ptr, num_active_ptr, arena_ptr, pt_ptr, bf_ptr, gu_ptr, count_ptr, h_ptr,
                        hq_scale_ptr, hsum_ptr, ready_ptr, block0, E, H, F, pt_block_stride, pt_field_stride, log2p,
                        top_k, m_tiles, q_x, q_h, BN, BM, 0, USE_ASM, STAGES, STAGES, True)
    else:
        d = item - gate_up_programs
        k = d // row_tiles
        # Share k of a row tile: the first K range of every slot, then the second, ...
        down_program(d % row_tiles, (k % slots) * split + k // slots, progs_per_tile, h_ptr, hq_scale_ptr, hsum_ptr,
                     sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, tw_ptr, arena_ptr, pt_ptr, bf_ptr, out_ptr,
                     plan_ptr, ready_ptr, block0, E, H, F, pt_block_stride, pt_field_stride, log2p, split,
                     groups_per_split, top_k, q_h, BN, BM, 0, HS_SUB, USE_ASM, E_PAD, BALANCE, STAGES, STAGES, True,
                     False, DOWN_COSTS)
        # Every thread's reads of ready before this program counts as done.
        # The down programs alone count: when the last of them is done, every
        # ticket was taken (gate/up tickets come first) and every h tile that
        # is counted in ready was counted (some down program waited on it),
        # so no program touches the counters again.
        tl.debug_barrier()
        if tl.atomic_add(done_ptr, 1, sem="acq_rel") == tl.num_programs(0) - gate_up_programs - 1:
            for z0 in range(0, n_ready + 2, _ZERO_CHUNK):
                z = z0 + tl.arange(0, _ZERO_CHUNK)
                tl.store(ready_ptr + z, 0, mask=z < n_ready + 2)


def run_gate_up_down(ws: MoeWorkspace, topk_weights: torch.Tensor, weights: PagedWeights, layer: int,
                     num_experts: int, top_k: int, ffn: int, tiles: MoeTiles, log2p: int,
                     pdl: PdlPolicy = DEFAULT_PDL) -> None:
    """Launches 2 and 3 in one: accumulates ws.prep.out from ws.prep (after
    moe_prepare or moe_entry), as run_gate_up then run_down would; ws.h and
    ws.hsum hold h afterwards as well. tiles: MoeTiles.fits_one_launch."""
    if not tiles.fits_one_launch:
        raise ValueError("one launch takes the one-token tile without a wide tile and block_n_up == block_n_down")
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    if ws.counts.shape != counts_shape(t, top_k, ffn, num_experts, tiles):
        raise ValueError("workspace was allocated for other tiles")
    if ws.ready.numel() < ready_size(ffn, num_experts, tiles):
        raise ValueError("workspace's ready counters are too few for these tiles")
    row_tiles, progs_per_tile, split, groups_per_split = down_launch_shape(ws, tiles, num_experts, top_k, ffn)
    check_h_planes(ws, tiles)
    gate_up_programs = 2 * (ffn // tiles.block_n_up) * slots
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    pt = weights.page_table
    kernel = _moe_gate_up_down_kernel[(gate_up_programs + row_tiles * progs_per_tile,)](
        ws.prep.xp, ws.prep.xq_scale, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
        ws.prep.num_active, weights.storage.view(torch.int32), pt, weights.block_fields,
        ws.gu, ws.counts, ws.h, ws.hq_scale, ws.hsum, tw, ws.prep.out, ws.down_plan, ws.ready,
        layer * num_experts * PROJS_PER_EXPERT, num_experts, hidden, ffn, pt.stride(0), pt.stride(1), log2p, top_k,
        ws.counts.shape[2], ws.prep.xp.numel(), ws.h.numel(),
        slots, gate_up_programs, row_tiles, progs_per_tile, split, groups_per_split,
        BN=tiles.block_n_up, BM=tiles.block_m, HS_SUB=GROUP // tiles.block_n_up, USE_ASM=tiles.use_asm,
        E_PAD=down_plan_width(num_experts), BALANCE=tiles.balance_down, STAGES=tiles.num_stages,
        DOWN_COSTS=tiles.down_cost_word, **tiles.launch_options(), **pdl_options(ws.h.device, t, pdl),
    )
    settle_carveout(ws, kernel, tiles)
