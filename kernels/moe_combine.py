"""SiLU(gate) * up into the down launch's activations (kernels/moe_mixed.py).

The gate/up launch (kernels/moe_gate_up.py) stores each program's partial
sums in gu [pairs, SPLIT, 2, F], fp32 (fp16: MoeTiles.gate_up_sums_fp16).
h = SiLU(gate) * up, rounded to fp16, is then stored in sorted order as the
down launch reads it: the three fp16 activation planes in the tile's slot
order (weight_layout.plane_scales), or for the CUDA-core tile int16 per span
of 64 rows with its scales (weight_layout.quantize_activations), with
per-tile sums of h. Two callers:

* combine_h, inside the gate/up launch, by the last of a tile's 2 x SPLIT
  programs to arrive (the one-token tile);
* the combine launch here, after a gate/up launch that only stores its
  partial sums (MoeTiles.gate_up_apart): the weight launch then has neither
  the combine nor the token-tile loop, which takes it from 238 registers to
  168 at the 8-token tile (local Triton 3.6 sm_90, benchmarks/sass_loops.py;
  without only one of them: 202 or 204), so 3 of its programs fit on a
  multiprocessor instead of 2 (the default for the tensor-core tiles up to
  MoeTuning.gate_up_apart_max_tokens tokens). With
  MoeTiles.combine_one_plane it stores, of the three planes, only the one
  that the expert's down view reads: a third of the stores (Mixtral B=64:
  3.7 of 11 MB a layer).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.moe_decode import tile_k_order, virtual_slot
from kernels.moe_paged import PROJS_PER_EXPERT, PagedWeights, slot_expert
from kernels.moe_stage import FP16_MAX, SPAN, actual_to_virtual, pair_position, plane_scale, quantize_spans
from kernels.moe_tiles import MoeTiles
from kernels.moe_workspace import MoeWorkspace
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

_FP16_MAX_C = tl.constexpr(FP16_MAX)
# Warps of a combine program: its tile is BN x BM fp32 elements (at most
# 128 x 32), a few loads and stores each; no product.
COMBINE_WARPS = 4


@triton.jit
def h_columns(n, BM: tl.constexpr):
    """Where row n of h goes: the slot of its virtual position inside its
    group (the launch's tiles read the slot order of BM; MoeTiles keeps the
    narrow tile apart from a wide one)."""
    return (n // 128) * 128 + virtual_slot(actual_to_virtual(n % 128), BM)


@triton.jit
def combine_h(gate, up, h_ptr, hq_scale_ptr, hsum_ptr, pos64, m0, n, col, tile, F, q_h, keep, valid,
              BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, nf_down=0, ONE_PLANE: tl.constexpr = False):
    """Stores h = SiLU(gate) * up of one tile: gate, up fp32 [BN, BM] (rows
    n, sorted positions pos64; keep [BN, BM] the elements to store, valid
    [BM] the tokens) as the down launch reads it; m0 the tile's first
    position (BM 1: the one token), col = h_columns(n, BM). ONE_PLANE (BM >
    1): only the plane that the expert's down block of nf_down fields reads
    (weight_layout.view_plane), as the combine launch, which runs in the
    same step as that down launch (block_fields change only between steps,
    dataplane/weights/store.py); else all three."""
    h = gate / (1.0 + tl.exp(-gate)) * up
    h16 = tl.minimum(tl.maximum(h, -_FP16_MAX_C), _FP16_MAX_C).to(tl.float16)
    _store_h_sums(hsum_ptr, pos64, F, tile, tl.where(keep, h16.to(tl.float32), 0.0), valid, BN, BM)
    if BM == 1:
        # BN rows = BN / SPAN whole spans (F and BN are multiples of 64)
        q, scale = quantize_spans(tl.reshape(h16.to(tl.float32), (1, BN)), 1, BN)
        row = tl.cast(m0, tl.int64)
        tl.store(h_ptr + row * F + pair_position(n), tl.reshape(q, (BN,)))
        spans = tile * (BN // SPAN) + tl.arange(0, BN // SPAN)
        tl.store(hq_scale_ptr + row * (F // SPAN) + spans, tl.reshape(scale, (BN // SPAN,)))
    elif ONE_PLANE:
        _store_view_plane(h_ptr, q_h, pos64, F, col, h16, keep, nf_down, BM)
    else:
        tl.store(h_ptr + pos64[None, :] * F + col[:, None], h16, mask=keep)
        _store_scaled_planes(h_ptr, q_h, pos64, F, col, h16, keep, BM, USE_ASM)


@triton.jit
def store_sums(at, acc, keep):
    """Stores fp32 sums acc at `at` (mask keep) in gu's dtype: for fp16
    (MoeTiles.gate_up_sums_fp16) clamped to its finite range first, since an
    infinite gate would make SiLU(gate) NaN where fp32 gives h its clamp."""
    if at.dtype.element_ty == tl.float16:
        acc = tl.minimum(tl.maximum(acc, -_FP16_MAX_C), _FP16_MAX_C)
    tl.store(at, acc.to(at.dtype.element_ty), mask=keep)


@triton.jit
def sum_parts(gu_ptr, pos64, n, F, keep, SPLIT: tl.constexpr):
    """(gate, up) fp32 [BN, BM]: the SPLIT partial sums of each (stored in
    fp32 or fp16), added in fp32 in K order whichever program arrived last,
    so that h does not depend on the arrival order. From the L2 (.cg): other
    multiprocessors stored them."""
    at = gu_ptr + pos64[None, :] * (SPLIT * 2 * F) + n[:, None]
    gate = tl.load(at, mask=keep, other=0.0, cache_modifier=".cg").to(tl.float32)
    up = tl.load(at + F, mask=keep, other=0.0, cache_modifier=".cg").to(tl.float32)
    for p in tl.static_range(1, SPLIT):
        gate += tl.load(at + p * 2 * F, mask=keep, other=0.0, cache_modifier=".cg").to(tl.float32)
        up += tl.load(at + (p * 2 + 1) * F, mask=keep, other=0.0, cache_modifier=".cg").to(tl.float32)
    return gate, up


@triton.jit
def _store_h_sums(hsum_ptr, pos64, F, tile, h, valid, BN: tl.constexpr, BM: tl.constexpr):
    # The down launch's activation sums: h [BN, BM] (zero outside the rows
    # and tokens kept) summed per row tile, or per group of 128 rows where a
    # tile spans several groups (MoeTiles.h_sum_rows; the down launch reads
    # one sum per group then).
    if BN > 128:
        sums = tl.sum(tl.reshape(h, (BN // 128, 128, BM)), axis=1)  # [BN / 128, BM]
        j = tl.arange(0, BN // 128)
        at = hsum_ptr + pos64[None, :] * (F // 128) + tile * (BN // 128) + j[:, None]
        tl.store(at, sums, mask=valid[None, :])
    else:
        tl.store(hsum_ptr + pos64 * (F // BN) + tile, tl.sum(h, axis=0), mask=valid)


@triton.jit
def _store_scaled_planes(h_ptr, q_h, pos64, F, col, h16, keep, BM: tl.constexpr, USE_ASM: tl.constexpr):
    # Planes 1 and 2 of h (q_h elements apart): h16 times 2^-p by the virtual
    # position that slot col holds (tile_k_order; powers of two: exact but
    # for subnormals). The compiler hoisted the per-row factors above the K
    # loop, where they took registers that every loop of the launch then
    # lacked (local sm_90 SASS: 4-bit loop 449 -> 466 instructions); a
    # side-effecting copy of col pins them here.
    if USE_ASM:
        col = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [col], dtype=tl.int32,
                                        is_pure=False, pack=1)
    at = pos64[None, :] * F + col[:, None]
    vpos = tile_k_order(col % 128, BM)
    tl.store(h_ptr + q_h + at, _scaled_plane(h16, vpos, 1), mask=keep)
    tl.store(h_ptr + 2 * q_h + at, _scaled_plane(h16, vpos, 2), mask=keep)


@triton.jit
def _scaled_plane(h16, vpos, PLANE: tl.constexpr):
    # fp16 [BN, BM]: h16 times the 2^-p of plane PLANE at each row's virtual
    # position vpos [BN] (plane_scale).
    return (h16.to(tl.float32) * plane_scale(vpos, PLANE)[:, None]).to(tl.float16)


@triton.jit
def _store_view_plane(h_ptr, q_h, pos64, F, col, h16, keep, nf_down, BM: tl.constexpr):
    # The one plane the down view of nf_down fields reads
    # (weight_layout.view_plane: 2 for 1 field, 1 for 2-3, else 0). One
    # branch per program: nf_down is the expert's.
    at = pos64[None, :] * F + col[:, None]
    if nf_down >= 4:
        tl.store(h_ptr + at, h16, mask=keep)
    elif nf_down >= 2:
        tl.store(h_ptr + q_h + at, _scaled_plane(h16, tile_k_order(col % 128, BM), 1), mask=keep)
    else:
        tl.store(h_ptr + 2 * q_h + at, _scaled_plane(h16, tile_k_order(col % 128, BM), 2), mask=keep)


@triton.jit
def _combine_token_tile(gu_ptr, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, tile, F, q_h, nf_down, BN: tl.constexpr,
                        BM: tl.constexpr, USE_ASM: tl.constexpr, SPLIT: tl.constexpr, ONE_PLANE: tl.constexpr):
    # Sorted positions [m0, m0 + BM) of an expert's range ending at `end`.
    pos = m0 + tl.arange(0, BM)
    valid = pos < end
    keep = (n < F)[:, None] & valid[None, :]
    pos64 = pos.to(tl.int64)
    gate, up = sum_parts(gu_ptr, pos64, n, F, keep, SPLIT)
    combine_h(gate, up, h_ptr, hq_scale_ptr, hsum_ptr, pos64, m0, n, h_columns(n, BM), tile, F, q_h, keep, valid,
              BN, BM, USE_ASM, nf_down, ONE_PLANE)


@triton.jit(do_not_specialize=["block0"])
def _moe_combine_kernel(
    offsets_ptr,  # [E + 1] int32
    active_ptr,  # [E] int32 experts with tokens
    num_active_ptr,  # [1] int32
    bf_ptr,  # [num_blocks] int32 resident field count per block
    gu_ptr,  # [T * top_k, SPLIT, 2, F] fp32 or fp16: the gate/up launch's partial sums
    h_ptr,  # [3, T * top_k, F] fp16 out, as kernels/moe_gate_up._moe_gate_up_kernel's (int16 [1, ...]: BM 1)
    hq_scale_ptr,  # [T * top_k, F / 64] fp32 out (BM 1)
    hsum_ptr,  # [T * top_k, F / min(BN, 128)] fp32 out
    block0, E, F,
    q_h,  # elements from one plane of h to the next
    BN: tl.constexpr, BM: tl.constexpr, BM_WIDE: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr,
    SPLIT: tl.constexpr,
    ONE_PLANE: tl.constexpr,  # only the plane of each expert's down view (MoeTiles.combine_one_plane)
):
    # Program (slot, row tile): the expert's token tiles, of BM, or of
    # BM_WIDE where it holds more than BM tokens (as the gate/up launch took
    # them); experts the gate/up launch skipped (a block without fields) too.
    # The routing and the field counts before the PDL wait: the gate/up
    # launch before does not write them (kernels/pdl.py).
    slot = tl.program_id(0)
    tile = tl.program_id(1)
    n_act = tl.load(num_active_ptr, cache_modifier=".cg")
    expert, blk, nf_g, nf_u, nf_d, start, end = slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E)
    wait_for_previous_grid(PDL)
    if slot < n_act:
        if (nf_g > 0) & (nf_u > 0) & (nf_d > 0):
            n = tile * BN + tl.arange(0, BN)
            if BM_WIDE > BM:  # compile time
                if end - start > BM:
                    for m0 in range(start, end, BM_WIDE):
                        _combine_token_tile(gu_ptr, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, tile, F, q_h, nf_d, BN,
                                            BM_WIDE, USE_ASM, SPLIT, ONE_PLANE)
                else:
                    _combine_token_tile(gu_ptr, h_ptr, hq_scale_ptr, hsum_ptr, start, end, n, tile, F, q_h, nf_d,
                                        BN, BM, USE_ASM, SPLIT, ONE_PLANE)
            else:
                for m0 in range(start, end, BM):
                    _combine_token_tile(gu_ptr, h_ptr, hq_scale_ptr, hsum_ptr, m0, end, n, tile, F, q_h, nf_d, BN, BM,
                                        USE_ASM, SPLIT, ONE_PLANE)


def run_combine(ws: MoeWorkspace, weights: PagedWeights, layer: int, num_experts: int, top_k: int, ffn: int,
                tiles: MoeTiles, pdl: PdlPolicy = DEFAULT_PDL) -> None:
    """The combine launch: ws.h (its planes; with tiles.combine_one_plane of
    each expert the plane its down view reads, weight_layout.view_plane),
    ws.hq_scale, ws.hsum from the partial sums ws.gu that a gate/up launch
    of tiles.gate_up_apart left (kernels/moe_gate_up.run_gate_up queues
    it). pdl: the policy of the decode step's small launches, not the weight
    launches' (PdlPolicy.moe_weights): its waiting programs are small."""
    t = ws.prep.xp.shape[0]
    slots = min(num_experts, t * top_k)
    grid = (slots, ffn // tiles.block_n_up)
    _moe_combine_kernel[grid](
        ws.prep.offsets, ws.prep.active, ws.prep.num_active, weights.block_fields, ws.gu, ws.h, ws.hq_scale,
        ws.hsum, layer * num_experts * PROJS_PER_EXPERT, num_experts, ffn, ws.h.numel(),
        BN=tiles.block_n_up, BM=tiles.block_m, BM_WIDE=tiles.block_m_wide, USE_ASM=tiles.use_asm,
        SPLIT=tiles.split_up, ONE_PLANE=tiles.combine_one_plane, num_warps=COMBINE_WARPS,
        **pdl_options(ws.h.device, t, pdl))

