"""MoE step preparation in one launch: sort tokens by expert and stage activations.

Program 0 sorts the T * top_k (token, slot) pairs by expert (stable), writes
the expert offsets and the compacted list of experts that got tokens. The
other programs each take GROUPS_PER_STEP groups of one token's row: copy them
(rounded to fp16) in the MoE kernels' in-group K order, store their sums,
zero the same part of the output row. One chunk per program, not one row: at decode sizes a
row per program left a few programs looping over their row one chunk after
another (Mixtral B=1: two programs, four dependent chunks each). Nothing here
needs a host sync, so the step can run under CUDA graphs.

Outputs (all device tensors):
* xp        fp16  [T, H]   x in the slot order (weight_layout.slot_virtual: the virtual
                  in-group order, or the 8-token tile's with MoePrep.narrow_order),
                  clamped to fp16 and rounded to it
* xsum      fp32  [T, H / 128]  sums of xp per group
* x_planes  fp16  [3, T, H] xp (plane 0) and xp times weight_layout.plane_scales(1)
            and (2) at each position: the activations each view's decode reads
            (weight_layout.view_plane). For the CUDA-core tile
            (MoeTiles.activation_dtype int16) one plane instead: xp quantized
            to int16 (weight_layout.quantize_activations, pair order), and
* xq_scale  fp32  [T, H / 64] its scales ([T, 0] with fp16 planes: act_scale_columns)
* out       fp32  [T, H]   zeroed (the down kernel accumulates into it)
* sorted    int32 [T * top_k]  flat indices t * top_k + j sorted by expert
* offsets   int32 [E + 1]  sorted[offsets[e]:offsets[e + 1]] go to expert e
* active    int32 [E]      experts with tokens in slots 0..num_active-1: the
                  costliest first by slot_cost (the down blocks' field counts), ties
                  and no slot_cost ascending. Both weight launches number their
                  programs slot-major, so the first wave holds the costliest
                  experts' programs and the next fills in with the cheaper ones
                  (in a mixed state, resident programs pair a wide view with a
                  narrow one instead of two wide ones)
* num_active int32 [1]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.moe_stage import FP16_MAX, load_order, order_tile, stage_chunk
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.weight_layout import ACT_SPAN, GROUP, NUM_PLANES, permute_groups, plane_scales, quantize_activations

# The single-program sort handles up to this many (token, slot) pairs; larger
# batches (prefill) sort with torch ops, still without a host sync.
MAX_PAIRS_IN_KERNEL = 1024
GROUPS_PER_STEP = 8


@dataclass
class MoePrep:
    xp: torch.Tensor  # plane 0 of x_planes
    xsum: torch.Tensor
    x_planes: torch.Tensor
    xq_scale: torch.Tensor
    out: torch.Tensor
    sorted_ids: torch.Tensor
    offsets: torch.Tensor
    active: torch.Tensor
    num_active: torch.Tensor
    # The fp16 planes hold each group in the 8-token tile's slot order
    # (weight_layout.slot_virtual; MoeTiles.narrow_order), else in the virtual order.
    narrow_order: bool = False


@triton.jit
def sort_pairs(ids, n_pairs, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, cost, E,
               PAIRS_PAD: tl.constexpr, E_PAD: tl.constexpr, HAS_COST: tl.constexpr):
    """ids: int32 [PAIRS_PAD], the expert of each (token, slot) pair (pairs
    past n_pairs and ids outside [0, E) are skipped); cost: [E_PAD] the
    experts' slot cost (load_slot_cost; read only with HAS_COST). Writes
    sorted, offsets, active and num_active (the module docstring)."""
    t = tl.arange(0, PAIRS_PAD)
    e = tl.arange(0, E_PAD)
    valid = (t < n_pairs) & (ids >= 0) & (ids < E)
    onehot = ((ids[:, None] == e[None, :]) & valid[:, None]).to(tl.int32)  # [PAIRS_PAD, E_PAD]
    counts = tl.sum(onehot, axis=0)  # [E_PAD]
    rank = tl.sum((tl.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # [PAIRS_PAD]
    ends = tl.cumsum(counts, axis=0)
    starts = ends - counts
    pos = tl.sum(onehot * starts[None, :], axis=1) + rank
    tl.store(sorted_ptr + pos, t, mask=valid)
    tl.store(offsets_ptr + e, starts, mask=e < E)
    tl.store(offsets_ptr + E, tl.sum(counts, axis=0))
    has = (counts > 0) & (e < E)
    if HAS_COST:
        # slot = active experts before e: costlier, or as costly with a lower id
        ahead = has[None, :] & ((cost[None, :] > cost[:, None])
                                | ((cost[None, :] == cost[:, None]) & (e[None, :] < e[:, None])))
        slot = tl.sum(ahead.to(tl.int32), axis=1)
    else:
        slot = tl.cumsum(has.to(tl.int32), axis=0) - 1
    tl.store(active_ptr + slot, e, mask=has)
    tl.store(num_active_ptr, tl.sum(has.to(tl.int32), axis=0))


@triton.jit
def load_slot_cost(cost_ptr, cost_stride, E, E_PAD: tl.constexpr, HAS_COST: tl.constexpr):
    """[E_PAD] int32 slot cost of each expert for sort_pairs (zeros without
    HAS_COST). Apart from the sort so that a caller can issue the load first,
    off its sort's chain (kernels/moe_entry.py), before its PDL wait: through
    the L2 (kernels/pdl.py)."""
    e = tl.arange(0, E_PAD)
    cost = tl.zeros((E_PAD,), tl.int32)
    if HAS_COST:
        cost = tl.load(cost_ptr + e * cost_stride, mask=e < E, other=0, cache_modifier=".cg").to(tl.int32)
    return cost


# T and n_pairs vary with every step's token count: specialized (Triton marks
# an int argument equal to 1 or divisible by 16), each mixed or prefill step
# whose count is not a multiple of 16 compiled a variant of its own, live (a
# 2.7 s step in benchmarks/memory_pressure.py's burst, NOTES session 43). The
# variants left are those of the constexprs, which the start-up warm-up's
# rounds cover (dataplane/warmup.py).
@triton.jit(do_not_specialize=["T", "n_pairs"])
def _moe_prep_kernel(
    x_ptr,  # [T, H] float (row stride stride_x)
    ids_ptr,  # [T * TOPK] int32 expert of each (token, slot)
    xp_ptr,  # [3, T, H] fp16 out: the activation planes ([1, T, H] int16: QUANTIZE)
    xq_scale_ptr,  # [T, H / 64] fp32 out (QUANTIZE)
    xsum_ptr,  # [T, H / 128] fp32 out
    out_ptr,  # [T, H] fp32 out, zeroed
    sorted_ptr,  # [T * TOPK] int32 out
    offsets_ptr,  # [E + 1] int32 out
    active_ptr,  # [E] int32 out
    num_active_ptr,  # [1] int32 out
    cost_ptr,  # [E] int32 cost class of each expert, element stride cost_stride (HAS_COST)
    T, H, stride_x, E, n_pairs, n_chunks, cost_stride,
    GB: tl.constexpr, PAIRS_PAD: tl.constexpr, E_PAD: tl.constexpr, DO_SORT: tl.constexpr,
    QUANTIZE: tl.constexpr, HAS_COST: tl.constexpr, PDL: tl.constexpr, ORDER_BM: tl.constexpr,
):
    # Program 0 sorts (it has the longest chain); program 1 + r * n_chunks + c
    # stages chunk c (GB groups) of token row r.
    wait_for_previous_grid(PDL)
    pid = tl.program_id(0)
    if pid > 0:
        v = tl.arange(0, 128)
        row = ((pid - 1) // n_chunks).to(tl.int64)
        gg = ((pid - 1) % n_chunks) * GB + tl.arange(0, GB)
        gm = gg < H // 128
        act = load_order(v, QUANTIZE, ORDER_BM)
        xv = tl.load(x_ptr + row * stride_x + gg[:, None] * 128 + act[None, :], mask=gm[:, None], other=0.0)
        stage_chunk(xv, row, gg, gm, v, xp_ptr, xq_scale_ptr, xsum_ptr, out_ptr, T, H, GB, QUANTIZE, ORDER_BM)
    elif DO_SORT:
        t = tl.arange(0, PAIRS_PAD)
        cost = load_slot_cost(cost_ptr, cost_stride, E, E_PAD, HAS_COST)
        ids = tl.load(ids_ptr + t, mask=t < n_pairs, other=-1)
        sort_pairs(ids, n_pairs, sorted_ptr, offsets_ptr, active_ptr, num_active_ptr, cost, E,
                   PAIRS_PAD, E_PAD, HAS_COST)


def _sort_with_torch(ids: torch.Tensor, num_experts: int, prep: MoePrep,
                     slot_cost: torch.Tensor | None = None) -> None:
    """Same outputs as the in-kernel sort, by torch ops without host syncs."""
    valid = (ids >= 0) & (ids < num_experts)
    key = torch.where(valid, ids, torch.full_like(ids, num_experts)).to(torch.int64)
    order = torch.sort(key, stable=True).indices
    prep.sorted_ids.copy_(order.to(torch.int32))
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    counts.index_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    prep.offsets[0] = 0
    prep.offsets[1:].copy_(torch.cumsum(counts, 0).to(torch.int32))
    has = counts > 0
    expert = torch.arange(num_experts, dtype=torch.int64, device=ids.device)
    # Active experts first, costliest first (ties by id); slots past num_active are not read.
    key = expert if slot_cost is None else (slot_cost.max() - slot_cost.to(torch.int64)) * num_experts + expert
    key = torch.where(has, key, key.max() + 1 + expert)
    prep.active.copy_(torch.argsort(key).to(torch.int32))
    prep.num_active.copy_(has.sum().to(torch.int32).reshape(1))


PLANE_DTYPES = (torch.float16, torch.int16)


def planes_of(dtype: torch.dtype) -> int:
    """Activation planes staged in this element type: three fp16 planes for
    the tensor cores, one int16 plane for the CUDA-core tile."""
    if dtype not in PLANE_DTYPES:
        raise ValueError(f"activation planes must be fp16 or int16, got {dtype}")
    return NUM_PLANES if dtype == torch.float16 else 1


def act_scale_columns(dtype: torch.dtype, k: int) -> int:
    """Scales per row of activations [.., k] staged in this element type: one
    per span of 64 for int16, none for the fp16 planes."""
    return k // ACT_SPAN if planes_of(dtype) == 1 else 0


def alloc_prep(num_tokens: int, top_k: int, hidden: int, num_experts: int,
               device: torch.device | str, plane_dtype: torch.dtype = torch.float16,
               narrow_order: bool = False) -> MoePrep:
    """Uninitialised buffers for moe_prepare (reuse them across steps / graphs).
    plane_dtype: of x_planes (MoeTiles.activation_dtype); narrow_order: the
    fp16 planes' slot order (MoeTiles.narrow_order)."""
    planes = torch.empty(planes_of(plane_dtype), num_tokens, hidden, dtype=plane_dtype, device=device)
    return MoePrep(
        xp=planes[0], x_planes=planes,
        xq_scale=torch.empty(num_tokens, act_scale_columns(plane_dtype, hidden), dtype=torch.float32,
                             device=device),
        xsum=torch.empty(num_tokens, hidden // GROUP, dtype=torch.float32, device=device),
        out=torch.empty(num_tokens, hidden, dtype=torch.float32, device=device),
        sorted_ids=torch.empty(num_tokens * top_k, dtype=torch.int32, device=device),
        offsets=torch.empty(num_experts + 1, dtype=torch.int32, device=device),
        active=torch.empty(num_experts, dtype=torch.int32, device=device),
        num_active=torch.empty(1, dtype=torch.int32, device=device),
        narrow_order=narrow_order,
    )


def check_planes(planes: torch.Tensor, first: torch.Tensor, name: str) -> None:
    """The kernels reach plane p as `first` + p * numel: `planes` must be one
    contiguous [planes_of(dtype), ...] buffer whose plane 0 is `first`."""
    count = planes_of(planes.dtype)
    if not (planes.is_contiguous() and planes.shape[0] == count and planes.shape[1:] == first.shape
            and first.data_ptr() == planes.data_ptr() and first.dtype == planes.dtype):
        raise ValueError(f"{name} must be plane 0 of one contiguous [{count}, ...] buffer")


def check_prep_inputs(prep: MoePrep, num_tokens: int, hidden: int, n_pairs: int, num_experts: int,
                      slot_cost: torch.Tensor | None, device: torch.device) -> None:
    """The prep buffers fit these sizes (their x planes one buffer), and
    slot_cost (if any) is int32 [E] on the device: what a launch that fills
    them (moe_prepare, kernels/moe_entry.py) needs."""
    if (prep.xp.shape != (num_tokens, hidden) or prep.sorted_ids.shape != (n_pairs,)
            or prep.active.shape != (num_experts,)):
        raise ValueError("prep buffers do not match these sizes")
    check_planes(prep.x_planes, prep.xp, "xp")
    if slot_cost is not None and (slot_cost.shape != (num_experts,) or slot_cost.dtype != torch.int32
                                  or slot_cost.device != device):
        raise ValueError(f"slot_cost must be int32 [{num_experts}] on {device}")


def moe_prepare(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                prep: MoePrep | None = None, slot_cost: torch.Tensor | None = None,
                pdl: PdlPolicy = DEFAULT_PDL) -> MoePrep:
    """Runs the prep launch. x: [T, H] float; topk_ids: [T, top_k] int.

    prep: buffers from alloc_prep for these sizes (allocated when None).
    slot_cost: int32 [E] on x's device, any stride: the order of the active
    experts' slots, costliest first (see the module doc); read at run time,
    so a CUDA graph follows later changes to it. None: ascending ids.
    pdl: which launches take part in PDL (kernels/pdl.py).
    """
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"need x [T, H] and topk_ids [T, k], got {tuple(x.shape)}, {tuple(topk_ids.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16/bf16/fp32, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("x must be contiguous along the hidden dim")
    t, h = x.shape
    if h % GROUP:
        raise ValueError(f"hidden size must be a multiple of {GROUP}, got {h}")
    if num_experts <= 0:
        raise ValueError("num_experts must be positive")
    n_pairs = topk_ids.numel()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    if prep is None:
        prep = alloc_prep(t, topk_ids.shape[1], h, num_experts, x.device)
    check_prep_inputs(prep, t, h, n_pairs, num_experts, slot_cost, x.device)
    do_sort = n_pairs <= MAX_PAIRS_IN_KERNEL
    n_chunks = triton.cdiv(h // GROUP, GROUPS_PER_STEP)
    _moe_prep_kernel[(1 + t * n_chunks,)](
        x, ids, prep.xp, prep.xq_scale, prep.xsum, prep.out, prep.sorted_ids, prep.offsets, prep.active,
        prep.num_active, prep.offsets if slot_cost is None else slot_cost,
        t, h, x.stride(0), num_experts, n_pairs, n_chunks, 0 if slot_cost is None else slot_cost.stride(0),
        GB=GROUPS_PER_STEP, PAIRS_PAD=triton.next_power_of_2(max(n_pairs, 16)),
        E_PAD=triton.next_power_of_2(max(num_experts, 16)), DO_SORT=do_sort,
        QUANTIZE=prep.xp.dtype == torch.int16, HAS_COST=slot_cost is not None,
        ORDER_BM=order_tile(prep.narrow_order), num_warps=4, **pdl_options(x.device, t, pdl),
    )
    if not do_sort:
        _sort_with_torch(ids, num_experts, prep, slot_cost)
    return prep


def moe_prepare_reference(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                          plane_dtype: torch.dtype = torch.float16,
                          slot_cost: torch.Tensor | None = None, narrow_order: bool = False) -> MoePrep:
    """Plain-torch version of moe_prepare (same outputs) for prep buffers of
    these plane_dtype and narrow_order."""
    t, h = x.shape
    x16 = x.float().clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    ids = topk_ids.reshape(-1).to(torch.int32)
    groups = permute_groups(x16, narrow_order).float().reshape(t, h // GROUP, GROUP)
    xq_scale = torch.zeros(t, act_scale_columns(plane_dtype, h), dtype=torch.float32, device=x.device)
    if planes_of(plane_dtype) == 1:
        q, xq_scale = quantize_activations(x16)
        planes = q[None]
    else:
        planes = torch.stack([(groups * plane_scales(p, narrow_order).to(x.device)).to(plane_dtype).reshape(t, h)
                              for p in range(NUM_PLANES)])
    prep = MoePrep(
        xp=planes[0],
        xsum=groups.sum(-1),
        x_planes=planes,
        xq_scale=xq_scale,
        out=torch.zeros(t, h, dtype=torch.float32, device=x.device),
        sorted_ids=torch.empty(ids.numel(), dtype=torch.int32, device=x.device),
        offsets=torch.empty(num_experts + 1, dtype=torch.int32, device=x.device),
        active=torch.empty(num_experts, dtype=torch.int32, device=x.device),
        num_active=torch.empty(1, dtype=torch.int32, device=x.device),
        narrow_order=narrow_order,
    )
    _sort_with_torch(ids, num_experts, prep, slot_cost)
    return prep
