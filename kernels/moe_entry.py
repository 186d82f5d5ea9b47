"""The MoE layer's entry at decode sizes in one launch: residual add + RMSNorm,
router, and the MoE prep.

Unfused, a decode step enters each MoE layer with three small launches:
add_rmsnorm (kernels/rmsnorm.py), gate_route (kernels/router.py) and
moe_prepare (kernels/moe_align.py), 2.3 + 4.3 + 1.5 us per layer of Mixtral
at B=1 on the H200 (benchmarks/results/e2e_h200_s16_b1_profile.json), each
mostly latency: gate_route is one program per token streaming the whole
router matrix. Here program (r, c) of T x n_chunks takes chunk c (GB groups
of 128) of token row r:

1. the row's residual sum s = residual + delta and its RMS statistics (each
   program of the row computes them alike; program c = 0 stores s);
2. its chunk of y = RMSNorm(s), in the prep's staging order, staged as
   moe_prepare stages x (moe_stage.stage_chunk): activation planes, group
   sums, the zeroed output;
3. its chunk's share of the gate logits y @ W.T (the chunk again, in K
   order, so W's loads are contiguous), stored to a scratch row;
4. the last chunk of a row to arrive sums the shares (in chunk order, so the
   result does not depend on arrival order), rounds them as nn.Linear's
   output is and routes the row (router.route_row: softmax, top-k,
   renormalisation, statistics);
5. the last row routed sorts the (token, slot) pairs by expert
   (moe_align.sort_pairs).

Every load is issued first (none depends on another), so the chain is about
one memory latency, the arrival atomics and the last program's routing and
sort. The routing statistics' row inputs and the slot costs are among those
first loads, with one row the sort takes the routed ids from registers, and
the counters are reset relaxed: in session 28's form the last program loaded
each input after its acquire, read the ids back and fenced before the sort,
four more memory latencies on its chain. With the gate/up combiner's
relaxed reset, measured end to end (H200, 4-bit B=1, three interleaved
rounds; benchmarks/results/e2e_h200_s30_ab.json): 305.1-305.4 tok/s against
299.6-300.9 before (d19e007); 8-bit 223.4 against 220.8. The loads of
what the previous launch does not write (the weights, the statistics
inputs, the slot costs) come before the PDL wait (kernels/pdl.py), so that
the chain's one latency is that of the just-written residual and delta in
the L2, not the weights' from HBM (session 30; not yet measured end to end).
Measured end to end on the H200 (synthetic Mixtral-8x7B, 4-bit
experts, CUDA graphs, one call against DataplaneConfig.fuse_moe_entry =
False; benchmarks/results/e2e_h200_s18_entry2{,_off}.json): B = 1 / 4 / 16 /
64 at 260.2 / 456.4 / 1350.5 / 4521.3 tok/s against 253.8 / 454.7 / 1342.2 /
4503.7. A first form that loaded each input where it used it (d466b10) lost
1.6 % at B=64 (e2e_h200_s18_entry{,_off}.json).

Arrival counters come from an ArrivalCounters buffer ([T + 1]: chunks per
row, rows routed) and are left at zero. y itself is never written: only the
router and the prep read it.

Numerics: s, its statistics and y as add_rmsnorm computes them; the logits
are float32 sums of the same products as gate_route's, in another order (so
they may differ from it in float32's last bits before the rounding); routing,
statistics and staging as route_row and stage_chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_align import GROUPS_PER_STEP, MAX_PAIRS_IN_KERNEL, MoePrep, check_prep_inputs, load_slot_cost, \
    moe_prepare_reference, sort_pairs
from kernels.moe_stage import load_order, order_tile, stage_chunk
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.rmsnorm import rmsnorm_reference
from kernels.router import RoutingTargets, _check_top_k, _statistics_args, gate_route_reference, \
    gate_route_suits, route_row, row_statistics_inputs
from kernels.weight_layout import GROUP

# Elements of the router matrix one program holds ([next_pow2(E), GB * 128]):
# bounds its registers (E <= 16 at GB = 8 groups per chunk).
ENTRY_MAX_GATE_TILE = 16384


@triton.jit
def _residual_sum(delta_ptrs, res_ptrs, mask, DTYPE: tl.constexpr):
    # As add_rmsnorm: delta rounded to the residual's dtype, then the sum rounded.
    d = tl.load(delta_ptrs, mask=mask, other=0.0).to(DTYPE)
    r = tl.load(res_ptrs, mask=mask, other=0.0)
    return (d.to(tl.float32) + r.to(tl.float32)).to(DTYPE)


# T varies with the step's token count: not specialized, so that a count
# that is not a multiple of 16 compiles no variant of its own (as
# moe_align._moe_prep_kernel); ONE_ROW keeps the one-token form's own code.
@triton.jit(do_not_specialize=["T"])
def _moe_entry_kernel(
    delta_ptr,  # [T, H] the block's output (row stride stride_d), residual's dtype or fp32
    res_ptr,  # [T, H] residual stream in (row stride stride_r)
    norm_w_ptr,  # [H] RMSNorm weight
    res_out_ptr,  # [T, H] residual + delta out, residual's dtype
    gate_w_ptr,  # [E, H] router weight, residual's dtype, contiguous
    partial_ptr,  # [T, n_chunks, BLOCK_E] fp32 scratch: each chunk's share of the logits
    count_ptr,  # [T + 1] int32, zero on entry and left zero: chunks arrived per row, rows routed
    ids_ptr,  # [T, K] int64 out
    weights_ptr,  # [T, K] float32 out
    routed_ptr, mass_ptr, seq_mass_ptr, token_seq_ptr, token_weight_ptr, stride_seq,
    xp_ptr, xq_scale_ptr, xsum_ptr, out_ptr,  # staging outputs (moe_align.MoePrep)
    sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, cost_ptr,  # sort outputs, slot cost
    T, H, E, stride_d, stride_r, eps, n_chunks, cost_stride,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
    NC_PAD: tl.constexpr, GB: tl.constexpr, PAIRS_PAD: tl.constexpr, E_PAD: tl.constexpr,
    QUANTIZE: tl.constexpr, HAS_COST: tl.constexpr, RECORD: tl.constexpr, WEIGHTED: tl.constexpr,
    PDL: tl.constexpr, ORDER_BM: tl.constexpr, ONE_ROW: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    chunk = pid % n_chunks
    dtype: tl.constexpr = res_out_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_H)
    hm = offs < H
    # The chunk's columns twice: in K order (cn, contiguous loads for the
    # router's share) and in the staging order (col: the slot order of the
    # fp16 planes, K order to quantize: moe_stage.load_order).
    cn = chunk * (GB * 128) + tl.arange(0, GB * 128)
    nm = cn < H
    v = tl.arange(0, 128)
    gg = chunk * GB + tl.arange(0, GB)
    gm = gg < H // 128
    act = load_order(v, QUANTIZE, ORDER_BM)
    col = gg[:, None] * 128 + act[None, :]  # [GB, 128]
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    # Every load first: none depends on another, so their latencies overlap.
    # Those of what the previous launch does not write (the weights, the
    # step's statistics inputs, the weight store's slot costs) before the PDL
    # wait (kernels/pdl.py): the weights come from HBM, the residual and
    # delta, just written, from the L2, so the wait is followed by the
    # shorter latency alone. The statistics inputs and the slot costs are
    # loaded by every program, though only the last ones use them: loaded
    # there, each was one more memory latency on the chain.
    nw_k = tl.load(norm_w_ptr + cn, mask=nm, other=0.0, cache_modifier=".cg").to(tl.float32)
    nw_c = tl.load(norm_w_ptr + col, mask=gm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    w = tl.load(gate_w_ptr + e[:, None] * H + cn[None, :], mask=emask[:, None] & nm[None, :],
                other=0.0, cache_modifier=".cg").to(tl.float32)  # [BLOCK_E, GB * 128]
    seq, tok_w = row_statistics_inputs(token_seq_ptr, token_weight_ptr, row, RECORD, WEIGHTED)
    cost = load_slot_cost(cost_ptr, cost_stride, E, E_PAD, HAS_COST)  # [E_PAD]
    wait_for_previous_grid(PDL)
    s = _residual_sum(delta_ptr + row * stride_d + offs, res_ptr + row * stride_r + offs, hm, dtype)  # [BLOCK_H]
    s_k = _residual_sum(delta_ptr + row * stride_d + cn, res_ptr + row * stride_r + cn, nm, dtype)  # [GB * 128]
    s_c = _residual_sum(delta_ptr + row * stride_d + col, res_ptr + row * stride_r + col, gm[:, None], dtype)
    # 1. the row's sum and statistics
    if chunk == 0:
        tl.store(res_out_ptr + row * H + offs, s, mask=hm)
    s32 = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(s32 * s32, axis=0) / H + eps)
    # 2. this chunk of y (add_rmsnorm's output at these columns), staged
    y_c = (nw_c * (s_c.to(tl.float32) * inv).to(dtype).to(tl.float32)).to(dtype)  # [GB, 128]
    stage_chunk(y_c, row, gg, gm, v, xp_ptr, xq_scale_ptr, xsum_ptr, out_ptr, T, H, GB, QUANTIZE, ORDER_BM)
    # 3. this chunk's share of the logits
    y_k = (nw_k * (s_k.to(tl.float32) * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(partial_ptr + (row * n_chunks + chunk) * BLOCK_E + e, tl.sum(w * y_k[None, :], axis=1))
    # 4. the row's last chunk routes it. The barriers put every thread's
    # stores before the one thread's release (and, with one row, before the
    # other threads read the ids back).
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel") == n_chunks - 1:
        c = tl.arange(0, NC_PAD)
        parts = tl.load(partial_ptr + (row * n_chunks + c[:, None]) * BLOCK_E + e[None, :],
                        mask=(c < n_chunks)[:, None], other=0.0, cache_modifier=".cg")  # [NC_PAD, BLOCK_E]
        logits = tl.sum(parts, axis=0).to(dtype).to(tl.float32)  # rounded as nn.Linear's output
        top_i = route_row(tl.where(emask, logits, float("-inf")), row, ids_ptr, weights_ptr,
                          routed_ptr, mass_ptr, seq_mass_ptr, stride_seq, seq, tok_w, E, K, BLOCK_E, BLOCK_K,
                          RECORD)  # [BLOCK_K]
        # Relaxed: the next use is in a later launch, after this grid's end
        # (with PDL, after its griddepcontrol wait), which orders it; an
        # acq_rel exchange put a GPU-wide fence, one more memory latency, on
        # the chain before the sort.
        tl.atomic_xchg(count_ptr + row, 0, sem="relaxed")
        # 5. the last row routed sorts the pairs. One row: it is the last, and
        # its pairs are its own top-k, taken from registers, not read back.
        t = tl.arange(0, PAIRS_PAD)
        if ONE_ROW:  # T == 1
            kk = tl.arange(0, BLOCK_K)
            ids = tl.sum(tl.where(t[:, None] == kk[None, :], top_i[None, :], 0), axis=1)  # [PAIRS_PAD]
            sort_pairs(tl.where(t < K, ids, -1), K, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr,
                       cost, E, PAIRS_PAD, E_PAD, HAS_COST)
        else:
            tl.debug_barrier()
            if tl.atomic_add(count_ptr + T, 1, sem="acq_rel") == T - 1:
                ids = tl.load(ids_ptr + t, mask=t < T * K, other=-1, cache_modifier=".cg").to(tl.int32)
                sort_pairs(ids, T * K, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, cost, E,
                           PAIRS_PAD, E_PAD, HAS_COST)
                tl.atomic_xchg(count_ptr + T, 0, sem="relaxed")  # as the row's counter


def moe_entry_suits(num_tokens: int, top_k: int, gate_weight: torch.Tensor) -> bool:
    """Whether moe_entry applies: the sizes where gate_route beats a GEMM
    (router.gate_route_suits), the pairs sorted in the kernel, and a router
    chunk within ENTRY_MAX_GATE_TILE."""
    num_experts, hidden = gate_weight.shape
    return (gate_route_suits(num_tokens, gate_weight) and num_tokens * top_k <= MAX_PAIRS_IN_KERNEL
            and hidden % GROUP == 0
            and triton.next_power_of_2(num_experts) * GROUPS_PER_STEP * GROUP <= ENTRY_MAX_GATE_TILE)


def moe_entry(delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
              gate_weight: torch.Tensor, top_k: int, prep: MoePrep, counters: ArrivalCounters,
              targets: RoutingTargets | None = None,
              slot_cost: torch.Tensor | None = None,
              pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch for add_rmsnorm, gate_route and moe_prepare (module docstring).

    delta: [T, H] residual's dtype or float32, unit last stride; residual:
    [T, H] unit last stride; norm_weight: [H]; gate_weight: [E, H] contiguous,
    residual's dtype; prep: alloc_prep buffers for these sizes, filled as
    moe_prepare(rmsnorm(residual + delta), topk_ids, E, prep, slot_cost) fills
    them; counters: the zeroed arrival counters borrowed (and left zero);
    targets: routing statistics as gate_route adds them; slot_cost: as
    moe_prepare's; pdl: kernels/pdl.py. Applies where moe_entry_suits. Returns (residual + delta
    [T, H] in residual's dtype, topk_ids [T, k] int64, topk_weights [T, k]
    float32).
    """
    if delta.dim() != 2 or delta.stride(1) != 1 or residual.shape != delta.shape or residual.stride(1) != 1:
        raise ValueError(f"delta and residual must be [T, H] with unit last stride, got "
                         f"{tuple(delta.shape)} and {tuple(residual.shape)}")
    t, hidden = residual.shape
    dtype, device = residual.dtype, residual.device
    if delta.dtype not in (dtype, torch.float32) or delta.device != device:
        raise ValueError(f"delta must be {dtype} (the residual's dtype) or float32 on {device}")
    if norm_weight.shape != (hidden,) or norm_weight.device != device:
        raise ValueError(f"norm_weight must be [{hidden}] on {device}")
    if (gate_weight.dim() != 2 or gate_weight.shape[1] != hidden or not gate_weight.is_contiguous()
            or gate_weight.dtype != dtype or gate_weight.device != device):
        raise ValueError(f"gate_weight must be a contiguous [E, {hidden}] {dtype} on {device}")
    num_experts = gate_weight.shape[0]
    _check_top_k(top_k, num_experts)
    if not moe_entry_suits(t, top_k, gate_weight):
        raise ValueError(f"moe_entry does not apply to {t} tokens, top-{top_k}, gate {tuple(gate_weight.shape)}")
    check_prep_inputs(prep, t, hidden, t * top_k, num_experts, slot_cost, device)
    res_out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=device)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=device)
    if t == 0:
        return res_out, ids, weights
    stats, flags = _statistics_args(targets, num_experts, t, ids, weights)
    n_chunks = triton.cdiv(hidden // GROUP, GROUPS_PER_STEP)
    block_e = triton.next_power_of_2(num_experts)
    partial = torch.empty(t, n_chunks, block_e, dtype=torch.float32, device=device)
    count = counters.take((t + 1,), device)
    _moe_entry_kernel[(t * n_chunks,)](
        delta, residual, norm_weight, res_out, gate_weight, partial, count, ids, weights, *stats,
        prep.xp, prep.xq_scale, prep.xsum, prep.out, prep.sorted_ids, prep.offsets, prep.active, prep.num_active,
        prep.offsets if slot_cost is None else slot_cost,
        t, hidden, num_experts, delta.stride(0), residual.stride(0), eps, n_chunks,
        0 if slot_cost is None else slot_cost.stride(0),
        K=top_k, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
        BLOCK_H=triton.next_power_of_2(hidden), NC_PAD=triton.next_power_of_2(n_chunks), GB=GROUPS_PER_STEP,
        PAIRS_PAD=triton.next_power_of_2(max(t * top_k, 16)), E_PAD=triton.next_power_of_2(max(num_experts, 16)),
        QUANTIZE=prep.xp.dtype == torch.int16, HAS_COST=slot_cost is not None, **flags,
        ORDER_BM=order_tile(prep.narrow_order), ONE_ROW=t == 1, num_warps=4,
        **pdl_options(device, t, pdl),
    )
    return res_out, ids, weights


def moe_entry_reference(delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        gate_weight: torch.Tensor, top_k: int, plane_dtype: torch.dtype = torch.float16,
                        slot_cost: torch.Tensor | None = None, narrow_order: bool = False):
    """Plain torch, the unfused order: (residual + delta, probs [T, E],
    topk_ids, topk_weights, MoePrep of the normalised rows; plane_dtype and
    narrow_order: the prep buffers')."""
    s = (residual.float() + delta.to(residual.dtype).float()).to(residual.dtype)
    y = rmsnorm_reference(s, norm_weight, eps)
    probs, ids, weights = gate_route_reference(y, gate_weight, top_k)
    prep = moe_prepare_reference(y, ids, gate_weight.shape[0], plane_dtype, slot_cost, narrow_order)
    return s, probs, ids, weights, prep
