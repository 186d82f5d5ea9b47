"""Fused mixed-precision MoE layer over paged multi-precision expert weights.

Three launches per layer, no host sync (CUDA-graph friendly); their shapes
come from kernels/moe_tiles.py:
1. moe_prepare (kernels/moe_align.py): sort (token, slot) pairs by expert,
   stage x as fp16 in the kernels' K order with per-group sums, zero the output;
2. _moe_gate_up_kernel: per (expert, 64 rows of F): gate and up projections of
   the expert's tokens, SiLU(gate) * up, stored as fp16 h in sorted order (and
   per-tile sums of h for the next kernel's group offsets);
3. _moe_down_kernel: per (expert, rows of H, K split): down projection of h,
   times the routing weight, atomically added into out [T, H] fp32 (the
   weighted sum over the top-k and the K split in one go).

Each block (one projection of one expert) is read through the page table at its
own bitwidth: the kernels read block_fields[block] and branch into a decode
specialised for that many fields, so blocks at different bits share a launch.
Blocks with block_fields == 0 (host-only) are skipped: an expert contributes
only when its three blocks are resident; the caller keeps tokens away from
host-only experts (or accepts that they contribute nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.moe_align import FP16_MAX, check_planes, moe_prepare, quarter_scale
from kernels.moe_decode import block_matmul_any
from kernels.moe_tiles import DEFAULT_SMS, PROGRAMS_PER_SM, MoeTiles, choose_tiles
from kernels.moe_workspace import MoeWorkspace, alloc_workspace, down_plan_width
from kernels.smem_carveout import limit_carveout_once
from kernels.weight_layout import (
    FIELD_WIDTHS,
    GROUP,
    NUM_FIELDS,
    TILE_ROWS,
    dequantize_view,
    field_bytes,
    pages_for,
)

PROJ_GATE, PROJ_UP, PROJ_DOWN = 0, 1, 2
PROJS_PER_EXPERT = 3
_FP16_MAX_C = tl.constexpr(FP16_MAX)


@dataclass(frozen=True)
class PagedWeights:
    """Device view of the weight store (docs/WEIGHT_LAYOUT.md)."""

    storage: torch.Tensor  # [num_pages, page_bytes] uint8, the arena
    page_table: torch.Tensor  # [num_blocks, 5, max_pages] int32, -1 = absent
    block_fields: torch.Tensor  # [num_blocks] int32, 0 = host-only


@triton.jit
def _gate_up_tiles(xp_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counters, h_ptr, hsum_ptr,
                   start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p, top_k,
                   q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    # Tokens [start, end) of the sorted list, BM at a time, through one
    # block's BN rows; per tile, the second of the gate/up pair to arrive
    # (counters[tile index]) combines SiLU(gate) * up.
    for m0 in range(start, end, BM):
        _gate_up_tile(xp_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr,
                      counters + (m0 - start) // BM, h_ptr, hsum_ptr, m0, end, n, rows, col, tile, which,
                      H, F, pt_field_stride, log2p, top_k, q_x, q_h, BN, BM, USE_ASM)


@triton.jit
def _gate_up_tile(xp_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counter, h_ptr, hsum_ptr,
                  m0, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p, top_k,
                  q_x, q_h, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr):
    m = tl.arange(0, BM)
    kv = tl.arange(0, 128)
    pos = m0 + m
    valid = pos < end
    flat = tl.load(sorted_ptr + pos, mask=valid, other=0)
    tok = (flat // top_k).to(tl.int64)
    xt_ptrs = xp_ptr + tok[None, :] * H + kv[:, None]
    xs_ptrs = xsum_ptr + tok * (H // 128)
    acc = block_matmul_any(bf_nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, 0,
                           H // 128, log2p, xt_ptrs, valid[None, :], xs_ptrs, valid, 1, q_x,
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
        h = gate / (1.0 + tl.exp(-gate)) * up
        h16 = tl.minimum(tl.maximum(h, -_FP16_MAX_C), _FP16_MAX_C).to(tl.float16)
        tl.store(h_ptr + pos64[None, :] * F + col[:, None], h16, mask=keep)
        tile_sum = tl.sum(tl.where(keep, h16.to(tl.float32), 0.0), axis=0)
        tl.store(hsum_ptr + pos64 * (F // BN) + tile, tile_sum, mask=valid)
        _store_quarter_scaled(h_ptr + q_h, pos64, F, col, h16, keep, USE_ASM)
        tl.atomic_xchg(counter, 0)


@triton.jit
def _store_quarter_scaled(hq_ptr, pos64, F, col, h16, keep, USE_ASM: tl.constexpr):
    # hq = h16 * 4^-s by position: the plane the down projection's 2-bit
    # blocks read (kernels/moe_align.py). The compiler hoisted the per-row
    # factors above the K loop, where they took registers that every loop of
    # the launch then lacked (local sm_90 SASS: 4-bit loop 449 -> 466
    # instructions); a side-effecting copy of col pins them here.
    if USE_ASM:
        col = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [col], dtype=tl.int32,
                                        is_pure=False, pack=1)
    hq = (h16.to(tl.float32) * quarter_scale(col % 128)[:, None]).to(tl.float16)
    tl.store(hq_ptr + pos64[None, :] * F + col[:, None], hq, mask=keep)


@triton.jit
def _expert_blocks(active_ptr, bf_ptr, slot, block0):
    # The expert in `slot`, its first block (gate; up and down follow) and the
    # three blocks' resident field counts (0 = host-only).
    expert = tl.load(active_ptr + slot)
    blk = block0 + expert * 3
    return expert, blk, tl.load(bf_ptr + blk), tl.load(bf_ptr + blk + 1), tl.load(bf_ptr + blk + 2)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles"])
def _moe_gate_up_kernel(
    xp_ptr,  # [2, T, H] fp16, x in virtual in-group order; then quarter-scaled
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
    h_ptr,  # [2, T * top_k, F] fp16 out, sorted order, virtual in-group order; then quarter-scaled
    hsum_ptr,  # [T * top_k, F / BN] fp32 out, per-tile sums of h
    block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
    q_x, q_h,  # element offsets of the second planes of xp and h
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
        expert, blk, nf_g, nf_u, nf_d = _expert_blocks(active_ptr, bf_ptr, slot, block0)
        if (nf_g > 0) & (nf_u > 0) & (nf_d > 0):
            nf = tl.where(which == 0, nf_g, nf_u)
            start = tl.load(offsets_ptr + expert)
            end = tl.load(offsets_ptr + expert + 1)
            n = tile * BN + tl.arange(0, BN)
            rows = tl.minimum(n, F - 1)
            pt_blk = pt_ptr + (blk + which).to(tl.int64) * pt_block_stride
            # Where row n of h goes: its virtual position inside its group.
            a = n % 128
            col = (n // 128) * 128 + ((a // 16) % 2) * 64 + (a % 4) * 16 + ((a // 4) % 2) * 8 \
                + (a // 32) * 2 + (a // 8) % 2
            counters = count_ptr + (expert * (F // BN) + tile) * m_tiles
            args = (xp_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, nf, gu_ptr, counters, h_ptr, hsum_ptr,
                    start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p, top_k, q_x, q_h)
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


@triton.jit
def _down_tiles(h_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, start, end, n, rows,
                g0, g1, H, F, pt_field_stride, log2p, top_k, q_x,
                BN: tl.constexpr, BM: tl.constexpr, HS_SUB: tl.constexpr, USE_ASM: tl.constexpr):
    # Tokens [start, end), BM at a time, through BN rows of the down block
    # over groups [g0, g1), weighted and added into out.
    for m0 in range(start, end, BM):
        _down_tile(h_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, m0, end, n, rows,
                   g0, g1, H, F, pt_field_stride, log2p, top_k, q_x, BN, BM, HS_SUB, USE_ASM)


@triton.jit
def _down_tile(h_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, m0, end, n, rows,
               g0, g1, H, F, pt_field_stride, log2p, top_k, q_x,
               BN: tl.constexpr, BM: tl.constexpr, HS_SUB: tl.constexpr, USE_ASM: tl.constexpr):
    m = tl.arange(0, BM)
    kv = tl.arange(0, 128)
    pos = m0 + m
    valid = pos < end
    pos64 = pos.to(tl.int64)
    xt_ptrs = h_ptr + pos64[None, :] * F + kv[:, None]
    xs_ptrs = hsum_ptr + pos64 * (F // 128 * HS_SUB)
    acc = block_matmul_any(nf_d, arena_ptr, pt_down, pt_field_stride, H, F, rows, g0, g1,
                           log2p, xt_ptrs, valid[None, :], xs_ptrs, valid, HS_SUB, q_x,
                           HS_SUB, BN, BM, USE_ASM)
    flat = tl.load(sorted_ptr + pos, mask=valid, other=0)
    tok = (flat // top_k).to(tl.int64)
    wt = tl.load(tw_ptr + flat, mask=valid, other=0.0)
    keep = (n < H)[:, None] & valid[None, :]
    tl.atomic_add(out_ptr + tok[None, :] * H + n[:, None], acc * wt[None, :], mask=keep, sem="relaxed")


# Relative time per weight group of each view (index = resident fields) in the
# down launch, from the layer's times per view (Mixtral B=16,
# benchmarks/results/moe_h200_s10.json: 2 / 3 / 4 / 6 / 8 bits at 255 / 315 /
# 351 / 410 / 478 us, in units of ~32 us); index 0 (host-only) costs nothing.
DOWN_GROUP_COST = (0, 8, 10, 11, 13, 15)
_COST1, _COST2, _COST3, _COST4, _COST5 = (tl.constexpr(c) for c in DOWN_GROUP_COST[1:])


@triton.jit
def _group_cost(nf):
    return tl.where(nf == 1, _COST1, tl.where(nf == 2, _COST2, tl.where(
        nf == 3, _COST3, tl.where(nf == 4, _COST4, tl.where(nf >= 5, _COST5, 0)))))


@triton.jit
def _down_segment(h_ptr, hsum_ptr, sorted_ptr, offsets_ptr, active_ptr, tw_ptr, arena_ptr, pt_ptr, bf_ptr,
                  out_ptr, slot, g0, g1, n, rows, block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k,
                  q_x, BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, HS_SUB: tl.constexpr,
                  USE_ASM: tl.constexpr):
    # Groups [g0, g1) of the down block of the expert in `slot`, rows n, all
    # of its tokens; nothing when one of the expert's blocks is host-only.
    expert, blk, nf_g, nf_u, nf_d = _expert_blocks(active_ptr, bf_ptr, slot, block0)
    if (nf_g > 0) & (nf_u > 0) & (nf_d > 0):
        start = tl.load(offsets_ptr + expert)
        end = tl.load(offsets_ptr + expert + 1)
        pt_down = pt_ptr + (blk + 2).to(tl.int64) * pt_block_stride
        args = (h_ptr, hsum_ptr, sorted_ptr, tw_ptr, arena_ptr, pt_down, nf_d, out_ptr, start, end, n, rows,
                g0, g1, H, F, pt_field_stride, log2p, top_k, q_x)
        if BM_WIDE > BM:  # compile time, as in the gate/up launch (narrow first)
            if end - start <= BM:
                _down_tiles(*args, BN, BM, HS_SUB, USE_ASM)
            else:
                _down_tiles(*args, BN, BM_WIDE, HS_SUB, USE_ASM)
        else:
            _down_tiles(*args, BN, BM, HS_SUB, USE_ASM)


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "split", "groups_per_split"])
def _moe_down_kernel(
    h_ptr,  # [2, T * top_k, F] fp16, sorted order, virtual in-group order; then quarter-scaled
    hsum_ptr,  # [T * top_k, F / BN_UP] fp32 per-tile sums of h
    sorted_ptr,  # [T * top_k] int32 flat (token, slot) sorted by expert
    offsets_ptr,  # [E + 1] int32
    active_ptr,  # [E] int32
    num_active_ptr,  # [1] int32
    tw_ptr,  # [T * top_k] fp32 routing weights
    arena_ptr,  # int32 arena words
    pt_ptr,  # [num_blocks, 5, max_pages] int32
    bf_ptr,  # [num_blocks] int32
    out_ptr,  # [T, H] fp32, accumulated into (zeroed by moe_prepare)
    plan_ptr,  # [programs, E_PAD] int32 scratch, one row per program (BALANCE only)
    block0, H, F, pt_block_stride, pt_field_stride, log2p, split, groups_per_split, top_k,
    q_x,  # element offset of the second plane of h
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, HS_SUB: tl.constexpr,
    USE_ASM: tl.constexpr, E_PAD: tl.constexpr, BALANCE: tl.constexpr,
):
    # Program (n, p) of split programs per expert slot: rows [n BN, +BN) of
    # the down blocks. Without BALANCE: slot p // split, K range p % split of
    # groups_per_split groups. With BALANCE: share p of the row tile's work,
    # which is the active experts' groups laid end to end, each group weighted
    # by its view's cost (DOWN_GROUP_COST); the program takes the groups whose
    # first unit falls in [p total / P, (p + 1) total / P). With equal views
    # that is the same split; with mixed views a program may finish one
    # expert's range and start the next, instead of the launch waiting on the
    # slowest views' programs.
    pid_n = tl.program_id(0)
    pid_p = tl.program_id(1)
    n_groups = F // 128
    n_act = tl.load(num_active_ptr)
    n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(n, H - 1)
    if BALANCE:
        e = tl.arange(0, E_PAD)
        live = e < n_act
        blks = block0 + tl.load(active_ptr + e, mask=live, other=0) * 3
        nf_g = tl.load(bf_ptr + blks, mask=live, other=0)
        nf_u = tl.load(bf_ptr + blks + 1, mask=live, other=0)
        nf_d = tl.load(bf_ptr + blks + 2, mask=live, other=0)
        unit = tl.where(live & (nf_g > 0) & (nf_u > 0), _group_cost(nf_d), 0)  # [E_PAD]
        # The slots' work ends go through this program's row of plan and come
        # back as loads from uniform addresses: values taken from the
        # reduction directly are per-thread to ptxas, and an expert slot or a
        # group range derived from them made every K loop re-derive its
        # addresses (Triton 3.6 SASS: 4-bit loop 434 -> 545 instructions, 224
        # bytes of spills; measured +18 % on the down launch).
        plan = plan_ptr + (pid_n * tl.num_programs(1) + pid_p).to(tl.int64) * E_PAD
        tl.store(plan + e, tl.cumsum(unit * n_groups, axis=0))
        tl.debug_barrier()
        for slot in range(0, n_act):
            # The share's bounds are reloaded per slot, not carried across
            # the K loops (the 3.6 SASS is the same either way).
            total = tl.load(plan + E_PAD - 1).to(tl.int64)
            lo = (pid_p * total // tl.num_programs(1)).to(tl.int32)
            hi = ((pid_p + 1) * total // tl.num_programs(1)).to(tl.int32)
            begin = tl.load(plan + slot - 1, mask=slot > 0, other=0)
            finish = tl.load(plan + slot)
            c = (finish - begin) // n_groups
            if (c > 0) & (finish > lo) & (begin < hi):
                # groups whose first unit begin + g c lies in [lo, hi)
                g0 = tl.maximum(lo - begin + c - 1, 0) // c
                g1 = tl.minimum(tl.maximum(hi - begin + c - 1, 0) // c, n_groups)
                if g0 < g1:
                    _down_segment(h_ptr, hsum_ptr, sorted_ptr, offsets_ptr, active_ptr, tw_ptr, arena_ptr, pt_ptr,
                                  bf_ptr, out_ptr, slot, g0, g1, n, rows, block0, H, F, pt_block_stride,
                                  pt_field_stride, log2p, top_k, q_x, BN, BM, BM_WIDE, HS_SUB, USE_ASM)
    else:
        slot = pid_p // split
        g0 = (pid_p % split) * groups_per_split
        g1 = tl.minimum(g0 + groups_per_split, n_groups)
        if (slot < n_act) & (g0 < g1):
            _down_segment(h_ptr, hsum_ptr, sorted_ptr, offsets_ptr, active_ptr, tw_ptr, arena_ptr, pt_ptr,
                          bf_ptr, out_ptr, slot, g0, g1, n, rows, block0, H, F, pt_block_stride,
                          pt_field_stride, log2p, top_k, q_x, BN, BM, BM_WIDE, HS_SUB, USE_ASM)


def _check_weights(weights: PagedWeights, hidden: int, ffn: int, blocks_needed: int) -> int:
    storage, pt, bf = weights.storage, weights.page_table, weights.block_fields
    if storage.dtype != torch.uint8 or storage.dim() != 2 or not storage.is_contiguous():
        raise ValueError("storage must be a contiguous uint8 [num_pages, page_bytes] tensor")
    page_bytes = storage.shape[1]
    if page_bytes & (page_bytes - 1):
        raise ValueError(f"page_bytes must be a power of two, got {page_bytes}")
    widest_tile = TILE_ROWS * max(hidden, ffn) * max(FIELD_WIDTHS) // 8
    if page_bytes < widest_tile:
        raise ValueError(f"page_bytes {page_bytes} < widest packed tile {widest_tile} (64 rows): "
                         "tiles would span >2 pages")

    if pt.dtype != torch.int32 or pt.dim() != 3 or pt.shape[1] != NUM_FIELDS or pt.stride(2) != 1:
        raise ValueError("page_table must be int32 [num_blocks, 5, max_pages] with unit last stride")
    if bf.dtype != torch.int32 or bf.dim() != 1 or bf.shape[0] != pt.shape[0]:
        raise ValueError("block_fields must be int32 [num_blocks]")
    if pt.shape[0] < blocks_needed:
        raise ValueError(f"page table has {pt.shape[0]} blocks, this layer needs {blocks_needed}")
    if not (storage.device == pt.device == bf.device):
        raise ValueError("storage, page_table and block_fields must be on one device")
    return page_bytes.bit_length() - 1


def fused_moe_mixed(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    weights: PagedWeights, layer: int, num_experts: int, ffn: int,
                    tiles: MoeTiles | None = None, workspace: MoeWorkspace | None = None) -> torch.Tensor:
    """MoE layer output fp32 [T, H] = sum_j w[t, j] * expert_{ids[t, j]}(x[t]).

    x: [T, H] fp16/bf16/fp32 (cast to fp16 for the tensor cores, clamped);
    topk_ids: [T, k] int (ids outside [0, E) are ignored); topk_weights: [T, k];
    weights: the arena and device tables; blocks ((layer * E + e) * 3 + proj).
    workspace: buffers from alloc_workspace (reused across calls and CUDA
    graphs); the result is workspace.prep.out. Three launches, no host sync.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got {tuple(x.shape)}")
    t, hidden = x.shape
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError("topk_ids and topk_weights must both be [T, k]")
    if hidden % GROUP or ffn % GROUP:
        raise ValueError(f"hidden and ffn must be multiples of {GROUP}")
    if layer < 0 or num_experts <= 0:
        raise ValueError("layer must be >= 0 and num_experts > 0")
    log2p = _check_weights(weights, hidden, ffn, (layer + 1) * num_experts * PROJS_PER_EXPERT)
    if x.device != weights.storage.device:
        raise ValueError("x and the weights must be on one device")
    top_k = topk_ids.shape[1]
    if tiles is None:
        sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
               if x.is_cuda else DEFAULT_SMS)
        tiles = choose_tiles(t, top_k, num_experts, hidden, ffn, sms, use_asm=x.is_cuda)
    if GROUP % tiles.block_n_up or ffn % tiles.block_n_up:
        raise ValueError(f"block_n_up {tiles.block_n_up} must divide 128 and ffn {ffn}")
    if workspace is None:
        workspace = alloc_workspace(t, top_k, hidden, ffn, num_experts, tiles, x.device)
    elif workspace.h.shape != (t * top_k, ffn) or workspace.hsum.shape[1] != ffn // tiles.block_n_up:
        raise ValueError("workspace does not match these sizes and tiles")
    if t == 0:
        return workspace.prep.out
    moe_prepare(x, topk_ids, num_experts, workspace.prep)
    run_gate_up(workspace, weights, layer, num_experts, top_k, ffn, tiles, log2p)
    run_down(workspace, topk_weights, weights, layer, num_experts, top_k, ffn, tiles, log2p)
    return workspace.prep.out


def run_gate_up(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int,
                top_k: int, ffn: int, tiles: MoeTiles, log2p: int) -> None:
    """Launch 2: ws.h, ws.hsum from ws.prep (after moe_prepare)."""
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    pt = weights.page_table
    if ws.counts.shape != (num_experts, ffn // tiles.block_n_up, max(1, triton.cdiv(t * top_k, tiles.block_m))):
        raise ValueError("workspace was allocated for other tiles")
    _check_h_planes(ws)
    kernel = _moe_gate_up_kernel[(2 * (ffn // tiles.block_n_up), slots)](
        ws.prep.xp, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
        ws.prep.num_active, weights.storage.view(torch.int32), pt, weights.block_fields,
        ws.gu, ws.counts, ws.h, ws.hsum, layer * num_experts * PROJS_PER_EXPERT, hidden, ffn,
        pt.stride(0), pt.stride(1), log2p, top_k, ws.counts.shape[2],
        ws.prep.xp.numel(), ws.h.numel(),
        BN=tiles.block_n_up, BM=tiles.block_m,
        BM_WIDE=tiles.block_m_wide,
        USE_ASM=tiles.use_asm, **tiles.launch_options(),
    )
    _settle_carveout(ws, kernel, tiles)


def run_down(ws: MoeWorkspace, topk_weights: torch.Tensor, weights: PagedWeights, layer: int,
             num_experts: int, top_k: int, ffn: int, tiles: MoeTiles, log2p: int) -> None:
    """Launch 3: accumulates ws.prep.out from ws.h (after run_gate_up)."""
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    row_tiles, progs_per_tile = tiles.down_grid(t, top_k, num_experts, hidden, ffn)
    split = progs_per_tile // slots
    if ws.down_plan.shape != (row_tiles * progs_per_tile, down_plan_width(num_experts)):
        raise ValueError("workspace was allocated for other tiles")
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    pt = weights.page_table
    _check_h_planes(ws)
    kernel = _moe_down_kernel[(row_tiles, progs_per_tile)](
        ws.h, ws.hsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active, ws.prep.num_active,
        tw, weights.storage.view(torch.int32), pt, weights.block_fields, ws.prep.out, ws.down_plan,
        layer * num_experts * PROJS_PER_EXPERT, hidden, ffn, pt.stride(0), pt.stride(1), log2p,
        split, triton.cdiv(ffn // GROUP, split), top_k, ws.h.numel(),
        BN=tiles.block_n_down, BM=tiles.block_m, BM_WIDE=tiles.block_m_wide,
        HS_SUB=GROUP // tiles.block_n_up, USE_ASM=tiles.use_asm,
        E_PAD=down_plan_width(num_experts), BALANCE=tiles.balance_down,
        **tiles.launch_options(),
    )
    _settle_carveout(ws, kernel, tiles)


def _check_h_planes(ws: MoeWorkspace) -> None:
    # The xp / xq planes are checked by moe_prepare.
    check_planes(ws.h, ws.hq, "h", "hq")


def _settle_carveout(ws: MoeWorkspace, kernel, tiles: MoeTiles) -> None:
    if tiles.limit_carveout and ws.h.is_cuda:
        limit_carveout_once(kernel, ws.carveouts_set, PROGRAMS_PER_SM, ws.h.device)


# -- plain-torch reference ----------------------------------------------------
def read_block(weights: PagedWeights, block: int, n: int, k: int) -> list[torch.Tensor]:
    """The resident fields' byte strings of one block, gathered from pages."""
    nf = int(weights.block_fields[block])
    out = []
    for f in range(nf):
        nbytes = field_bytes(f, n, k)
        pages = weights.page_table[block, f, : pages_for(nbytes, weights.storage.shape[1])]
        out.append(weights.storage[pages.long()].reshape(-1)[:nbytes])
    return out


def dequantized_block(weights: PagedWeights, block: int, n: int, k: int) -> torch.Tensor | None:
    """fp32 [n, k] weights of the block's current view, None when host-only."""
    fields = read_block(weights, block, n, k)
    return dequantize_view(fields, len(fields), n, k) if fields else None


def moe_mixed_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                        weights: PagedWeights, layer: int, num_experts: int,
                        ffn: int) -> torch.Tensor:
    """fp32 [T, H]: the same layer in fp32 from the dequantized current views."""
    t, hidden = x.shape
    out = torch.zeros(t, hidden, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in range(num_experts):
        hit = (topk_ids == e).nonzero()
        if hit.numel() == 0:
            continue
        blk = (layer * num_experts + e) * PROJS_PER_EXPERT
        w1 = dequantized_block(weights, blk + PROJ_GATE, ffn, hidden)
        w3 = dequantized_block(weights, blk + PROJ_UP, ffn, hidden)
        w2 = dequantized_block(weights, blk + PROJ_DOWN, hidden, ffn)
        if w1 is None or w3 is None or w2 is None:
            continue
        tok, slot = hit[:, 0], hit[:, 1]
        xe = xf[tok]
        h = torch.nn.functional.silu(xe @ w1.T) * (xe @ w3.T)
        out.index_add_(0, tok, (h @ w2.T) * topk_weights[tok, slot].float()[:, None])
    return out
