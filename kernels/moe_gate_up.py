"""Launch 2 of the fused MoE layer (kernels/moe_mixed.py): per (expert slot,
BN rows of F, gate or up, K range of MoeTiles.split_up), the projection of
the expert's tokens through the block's pages at its own bitwidth; the last
of each row tile's 2 x split_up programs to finish stores SiLU(gate) * up,
rounded to fp16, as h in sorted order, in the three
activation planes the down launch's views read (weight_layout.plane_scales),
or for the CUDA-core tile quantized to int16 per span of 64 rows
(weight_layout.quantize_activations), with per-tile sums of h
(kernels/moe_combine.combine_h). With MoeTiles.gate_up_apart a program
takes one token tile and stores its partial sums only; the combine launch
of kernels/moe_combine.py makes h after it.

At B=1 (Mixtral) the grid is 448 programs on 264 resident slots: under ncu
the multiprocessors' busy cycles were min / mean / max 49 k / 77 k / 88 k of
93 k, as if 40 ran two programs and 92 four (that split's mean: 76 k).
Sharing the work evenly among 264 programs (each 2-3 pieces of a row tile's
groups, partial products added into gu) balanced them (75 k / 86 k / 91 k) but took 13 % more busy cycles
in all, and decoded 0.8 % slower end to end at 4 bits, 3.2 % with mixed 2/6
(benchmarks/results/moe_ncu_b1_sm_active_s26_h200.json,
e2e_h200_s26_{classic,shared}.json); reverted."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_block_matmul import block_matmul_any, rows_of_tile
from kernels.moe_combine import combine_h, h_columns, run_combine, store_sums, sum_parts
from kernels.moe_cuda_core import int16_row_pointers
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights, slot_expert, token_class_bounds
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import MoeWorkspace, check_h_planes, counts_shape, launch_by_token_class, \
    settle_carveout, sums_dtype
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

@triton.jit
def _gate_up_tiles(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counters, h_ptr,
                   hq_scale_ptr, hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p,
                   top_k, q_x, q_h, ready, part, m_tile, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
                   STAGES: tl.constexpr, SIGNAL: tl.constexpr, SPLIT: tl.constexpr, APART: tl.constexpr):
    # Tokens [start, end) of the sorted list, BM at a time, through one
    # block's BN rows over K range `part` of SPLIT; per tile, the last of the
    # 2 * SPLIT programs of the gate/up pair to arrive (counters[tile index])
    # combines SiLU(gate) * up and, with SIGNAL, counts the token tile's h as
    # stored in *ready. APART: token tile m_tile alone, its partial sums
    # stored and nothing else (kernels/moe_combine.py combines them).
    if APART:
        m0 = start + m_tile * BM
        if m0 < end:
            _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counters,
                          h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile, which, H, F, pt_field_stride,
                          log2p, top_k, q_x, q_h, ready, part, BN, BM, USE_ASM, STAGES, SIGNAL, SPLIT, APART)
    else:
        for m0 in range(start, end, BM):
            _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr,
                          counters + (m0 - start) // BM, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile,
                          which, H, F, pt_field_stride, log2p, top_k, q_x, q_h, ready, part, BN, BM, USE_ASM,
                          STAGES, SIGNAL, SPLIT, APART)


@triton.jit
def _gate_up_tile(xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, bf_nf, gu_ptr, counter, h_ptr,
                  hq_scale_ptr, hsum_ptr, m0, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p, top_k,
                  q_x, q_h, ready, part, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
                  STAGES: tl.constexpr, SIGNAL: tl.constexpr, SPLIT: tl.constexpr, APART: tl.constexpr):
    m = tl.arange(0, BM)
    kv = tl.arange(0, 128)  # the planes hold each group in the decode's column order (slot order)
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
    g0 = 0
    g1 = H // 128
    if SPLIT > 1:
        g0 = part * g1 // SPLIT
        g1 = (part + 1) * g1 // SPLIT
    rows = rows_of_tile(rows, m0)
    acc = block_matmul_any(bf_nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, g0, g1, log2p, xt_ptrs,
                           valid[None, :], xs_ptrs, valid, 1, q_x, qs_ptrs, 1, BN, BM, USE_ASM, STAGES)
    keep = (n < F)[:, None] & valid[None, :]
    pos64 = pos.to(tl.int64)
    # gu [pairs, SPLIT, 2, F]: this program's partial sum
    mine = gu_ptr + ((pos64[None, :] * SPLIT + part) * 2 + which) * F + n[:, None]
    store_sums(mine, acc, keep)
    if not APART:
        tl.debug_barrier()
        if tl.atomic_add(counter, 1, sem="acq_rel") == 2 * SPLIT - 1:
            if SPLIT == 1:
                other = tl.load(gu_ptr + (pos64[None, :] * 2 + 1 - which) * F + n[:, None],
                                mask=keep, other=0.0, cache_modifier=".cg").to(tl.float32)
                gate = tl.where(which == 0, acc, other)
                up = tl.where(which == 0, other, acc)
            else:
                gate, up = sum_parts(gu_ptr, pos64, n, F, keep, SPLIT)
            combine_h(gate, up, h_ptr, hq_scale_ptr, hsum_ptr, pos64, m0, n, col, tile, F, q_h, keep, valid, BN, BM,
                      USE_ASM)
            if SIGNAL:
                # Every thread's h, hq_scale and hsum stores before the release
                # (kernels/moe_gate_up_down.py waits on this count).
                tl.debug_barrier()
                tl.atomic_add(ready, 1, sem="release")
            # Relaxed: the counter's next use is in a later launch, ordered by
            # this grid's end; acq_rel put a GPU-wide fence before the exit.
            tl.atomic_xchg(counter, 0, sem="relaxed")


@triton.jit(do_not_specialize=["block0", "top_k", "log2p", "m_tiles"])
def _moe_gate_up_kernel(
    xp_ptr,  # [3, T, H] fp16, x in the slot order of BM: the activation planes (int16 [1, T, H]: BM 1)
    xq_scale_ptr,  # [T, H / 64] fp32 scales of the int16 x (BM 1)
    xsum_ptr,  # [T, H / 128] fp32 group sums of xp
    sorted_ptr,  # [T * top_k] int32 flat (token, slot) sorted by expert
    offsets_ptr,  # [E + 1] int32
    active_ptr,  # [E] int32 experts with tokens
    num_active_ptr,  # [1] int32
    arena_ptr,  # [num_pages * page_bytes / 4] int32 arena words
    pt_ptr,  # [num_blocks, 5, max_pages] int64 page table (offsets from the arena base)
    bf_ptr,  # [num_blocks] int32 resident field count per block
    gu_ptr,  # [T * top_k, SPLIT, 2, F] fp32 or fp16 scratch: gate / up pre-activations, per K range
    count_ptr,  # [E, F / BN, m_tiles] int32 arrivals per tile, zero between launches
    h_ptr,  # [3, T * top_k, F] fp16 out, sorted, in the slot order of BM: the planes (int16 [1, ...]: BM 1)
    hq_scale_ptr,  # [T * top_k, F / 64] fp32 out, scales of the int16 h (BM 1)
    hsum_ptr,  # [T * top_k, F / min(BN, 128)] fp32 out, sums of h per tile (per group: BN > 128)
    block0, E, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles,
    q_x, q_h,  # elements from one plane of xp (of h) to the next
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr,
    STAGES: tl.constexpr,  # pipeline depth of the BM loops (MoeTiles.num_stages)
    STAGES_WIDE: tl.constexpr,  # of the BM_WIDE loops (MoeTiles.wide_loop_stages)
    SPLIT: tl.constexpr,  # K ranges of each projection (MoeTiles.split_up)
    INTERLEAVE: tl.constexpr,  # the grid is (slot, row program) (MoeTiles.gate_up_interleave)
    TOKENS_LO: tl.constexpr = 0,  # only experts of over TOKENS_LO tokens (0: no bound; run_gate_up)
    TOKENS_HI: tl.constexpr = 0,  # only experts of at most TOKENS_HI tokens (0: no bound)
    APART: tl.constexpr = False,  # token tile program_id(2) alone, no combine (MoeTiles.gate_up_apart)
):
    # Program ((tile * SPLIT + part) * 2 + which, slot[, token tile]), or the
    # transpose of the first two with INTERLEAVE (the first grid dimension is
    # dispatched first, the last last): gate_up_program.
    wait_for_previous_grid(PDL)
    if INTERLEAVE:
        pid = tl.program_id(1)
        slot = tl.program_id(0)
    else:
        pid = tl.program_id(0)
        slot = tl.program_id(1)
    gate_up_program(pid // (2 * SPLIT), pid % 2, slot, xp_ptr, xq_scale_ptr, xsum_ptr,
                    sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, arena_ptr, pt_ptr, bf_ptr, gu_ptr,
                    count_ptr, h_ptr, hq_scale_ptr, hsum_ptr, count_ptr, block0, E, H, F, pt_block_stride,
                    pt_field_stride, log2p, top_k, m_tiles, q_x, q_h, BN, BM, BM_WIDE, USE_ASM, STAGES, STAGES_WIDE,
                    False, (pid // 2) % SPLIT, SPLIT, TOKENS_LO, TOKENS_HI, APART, tl.program_id(2))


@triton.jit
def gate_up_program(tile, which, slot, xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, offsets_ptr, active_ptr,
                    num_active_ptr, arena_ptr, pt_ptr, bf_ptr, gu_ptr, count_ptr, h_ptr, hq_scale_ptr, hsum_ptr,
                    ready_ptr, block0, E, H, F, pt_block_stride, pt_field_stride, log2p, top_k, m_tiles, q_x, q_h,
                    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, USE_ASM: tl.constexpr,
                    STAGES: tl.constexpr, STAGES_WIDE: tl.constexpr, SIGNAL: tl.constexpr, part=0,
                    SPLIT: tl.constexpr = 1, TOKENS_LO: tl.constexpr = 0, TOKENS_HI: tl.constexpr = 0,
                    APART: tl.constexpr = False, m_tile=0):
    """One program of the gate/up launch (arguments as _moe_gate_up_kernel's):
    rows [tile * BN, +BN) of the gate (which = 0) or up (which = 1) block of
    the slot's expert, over K range `part` of SPLIT (groups cut evenly) and
    the expert's tokens in tiles of BM, or of
    BM_WIDE when the expert has more than BM tokens (one pass over the
    weights instead of two; both programs of a pair see the same count, so
    they take the same tiles). With SIGNAL, every combined token tile adds
    1 to ready_ptr[expert * (F / BN) + tile] after its h is stored (release),
    for a reader in the same launch (kernels/moe_gate_up_down.py); without,
    ready_ptr is not touched. TOKENS_LO / TOKENS_HI (0: no bound): the
    program works only for an expert of over TOKENS_LO and at most TOKENS_HI
    tokens, so that a launch takes one token class (MoeTiles.gate_up_split_stages).
    APART: only the expert's token tile m_tile (of BM, or of BM_WIDE), its
    partial sums stored in gu and nothing else: no arrival count, no h
    (kernels/moe_combine.py; SIGNAL must be False)."""
    n_act = tl.load(num_active_ptr)
    expert, blk, nf_g, nf_u, nf_d, start, end = slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E)
    lo, hi = token_class_bounds(start, end, TOKENS_LO, TOKENS_HI)
    # Every loaded value is tested in two conditions: the compiler would
    # otherwise sink each load below the branch before it, one round trip
    # after another. Not in one condition: with the slot test joined to the
    # others, ptxas gave the launch 255 registers instead of 225 and the
    # 8-bit one-token loop 406 instructions a step instead of 362 (local
    # Triton 3.6 sm_90, benchmarks/sass_loops.py).
    if slot < n_act:
        if (nf_g > 0) & (nf_u > 0) & (nf_d > 0) & (lo < end) & (end <= hi):
            nf = tl.where(which == 0, nf_g, nf_u)
            n = tile * BN + tl.arange(0, BN)
            rows = tl.minimum(n, F - 1)
            pt_blk = pt_ptr + (blk + which).to(tl.int64) * pt_block_stride
            col = h_columns(n, BM)
            counters = count_ptr + (expert * (F // BN) + tile) * m_tiles
            args = (xp_ptr, xq_scale_ptr, xsum_ptr, sorted_ptr, arena_ptr, pt_blk, nf, gu_ptr, counters, h_ptr,
                    hq_scale_ptr, hsum_ptr, start, end, n, rows, col, tile, which, H, F, pt_field_stride, log2p,
                    top_k, q_x, q_h, ready_ptr + expert * (F // BN) + tile, part, m_tile)
            if BM_WIDE > BM:  # compile time: this launch has a wide tile
                # The 16-token branch first: the compiler lays it out first, and
                # placed after the wide loops it ran 5-7 % slower with equal
                # loads (more no-instruction stalls; moe_narrow_first_*_h200.json).
                if end - start <= BM:
                    _gate_up_tiles(*args, BN, BM, USE_ASM, STAGES, SIGNAL, SPLIT, APART)
                else:
                    _gate_up_tiles(*args, BN, BM_WIDE, USE_ASM, STAGES_WIDE, SIGNAL, SPLIT, APART)
            else:
                _gate_up_tiles(*args, BN, BM, USE_ASM, STAGES, SIGNAL, SPLIT, APART)


def run_gate_up(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int,
                top_k: int, ffn: int, tiles: MoeTiles, log2p: int, pdl: PdlPolicy = DEFAULT_PDL,
                combine_pdl: PdlPolicy | None = None) -> None:
    """Launch 2: ws.h, ws.hsum from ws.prep (after moe_prepare); pdl: kernels/pdl.py.
    With tiles.gate_up_split_stages, two launches: the experts of over
    block_m tokens on the wide tile alone, and those of at most block_m on
    the base tile alone (each launch's programs of the other class exit at
    once), at once on two streams (moe_workspace.launch_by_token_class).
    With tiles.gate_up_apart, the launches store partial sums and the
    combine launch (kernels/moe_combine.py) follows them, under combine_pdl
    (None: pdl)."""
    t, hidden = ws.prep.xp.shape
    if ws.counts.shape != counts_shape(t, top_k, ffn, num_experts, tiles):
        raise ValueError("workspace was allocated for other tiles")
    check_h_planes(ws, tiles)
    if ws.gu.shape[1] != tiles.split_up or ws.gu.dtype != sums_dtype(tiles):
        raise ValueError("workspace was allocated for another gate/up split or sums dtype")
    launch_by_token_class(ws, tiles, tiles.gate_up_split_stages, lambda *tile_class: _launch_gate_up(
        ws, weights, layer, num_experts, top_k, ffn, tiles, log2p, pdl, *tile_class))
    if tiles.gate_up_apart:
        run_combine(ws, weights, layer, num_experts, top_k, ffn, tiles, pdl if combine_pdl is None else combine_pdl)


def apart_token_tiles(num_tokens: int, block_m: int, block_m_wide: int, tokens_hi: int) -> int:
    """Token tiles per expert that a gate/up launch of MoeTiles.gate_up_apart
    gives programs to (grid dimension 2): an expert holds at most num_tokens
    pairs (each token's ids distinct), in one tile of block_m where it has at
    most block_m (all of them in a launch of tokens_hi <= block_m), else in
    tiles of block_m_wide where the launch has the wide tile."""
    if 0 < tokens_hi <= block_m:
        return 1
    return max(1, triton.cdiv(num_tokens, block_m_wide if block_m_wide > block_m else block_m))


def _launch_gate_up(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int, top_k: int, ffn: int,
                    tiles: MoeTiles, log2p: int, pdl: PdlPolicy, block_m: int, block_m_wide: int, stages: int,
                    wide_stages: int, tokens_lo: int, tokens_hi: int) -> None:
    # One gate/up launch over every slot, of token tile block_m (and
    # block_m_wide), for the experts of over tokens_lo and at most tokens_hi
    # tokens (0: no bound).
    t, hidden = ws.prep.xp.shape
    slots = min(num_experts, t * top_k)
    pt = weights.page_table
    row_programs = 2 * tiles.split_up * (ffn // tiles.block_n_up)
    grid = (slots, row_programs) if tiles.gate_up_interleave else (row_programs, slots)
    if tiles.gate_up_apart:
        grid = (*grid, apart_token_tiles(t, block_m, block_m_wide, tokens_hi))
    options = tiles.launch_options(stages)
    capped = tiles.gate_up_maxnreg is not None and block_m == tiles.block_m and not block_m_wide
    if capped:
        options["maxnreg"] = tiles.gate_up_maxnreg
    kernel = _moe_gate_up_kernel[grid](
        ws.prep.xp, ws.prep.xq_scale, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
        ws.prep.num_active, weights.storage.view(torch.int32), pt, weights.block_fields,
        ws.gu, ws.counts, ws.h, ws.hq_scale, ws.hsum, layer * num_experts * PROJS_PER_EXPERT, num_experts,
        hidden, ffn,
        pt.stride(0), pt.stride(1), log2p, top_k, ws.counts.shape[2],
        ws.prep.xp.numel(), ws.h.numel(),
        BN=tiles.block_n_up, BM=block_m, BM_WIDE=block_m_wide,
        USE_ASM=tiles.use_asm, STAGES=stages, STAGES_WIDE=wide_stages,
        SPLIT=tiles.split_up, INTERLEAVE=tiles.gate_up_interleave, TOKENS_LO=tokens_lo, TOKENS_HI=tokens_hi,
        APART=tiles.gate_up_apart, **options, **pdl_options(ws.h.device, t, pdl),
    )
    settle_carveout(ws, kernel, tiles, by_registers=tiles.gate_up_apart or capped)
