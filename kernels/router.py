"""MoE router in one launch: gate logits, softmax, top-k, renormalise, routing statistics.

Plain torch spends ~10 launches per layer here (cast, softmax, top-k's gather
and sort, sum, divide, and the statistics' scatter/index adds). One program
per token row does all of it; the statistics are added with atomics (their
float sums are order-dependent in the last bits; they are telemetry, not
model output).

route takes router logits that were computed before. gate_route also computes
them, x @ W.T, in the same program: at decode sizes the logits GEMM moves a
few tens of KB and its time is launch and latency (on an H200, Mixtral's
4.3 us GEMM plus a 1.6 us split-K reduce per layer, beside the 1.7 us route).
Its logits are accumulated in float32 and rounded to x's dtype, as
nn.Linear's output is.

Numerics of the routing match route_reference (Mixtral's order): float32
softmax over all experts, the k largest probabilities (lowest index first on
ties), divided by their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

# gate_route is used up to this many tokens and this many elements of W.
# Each of its programs reads all of W (E*H elements) to make one row of
# logits, so traffic grows with T while cuBLAS reads W once: at prefill sizes
# the GEMM + route path wins, and decode batches are small. One program
# streams W alone, so a large W is slower than a GEMM spread over the SMs even
# at T = 1. Recorded: 4.3 us per layer for Mixtral's 8 x 4096 in the engine's
# B=1 profile (benchmarks/results/e2e_h200_s15_b1_profile.json), where the
# GEMM, its split-K reduce and route took ~7.6 us (e2e_h200_s11_profile.json).
# Recorded on the H200 (benchmarks/bench_router.py,
# benchmarks/results/router_h200_s16.json; graphs, statistics on, W in L2):
# gate_route against GEMM + route at T = 1 / 16 / 64 / 256, us: 8 x 4096
# 3.50 / 3.77 / 3.83 / 5.27 against 7.40 / 7.37 / 7.45 / 8.22; 8 x 6144
# 4.66 / 4.72 / 4.79 / 6.34 against 7.36 / 7.37 / 7.42 / 8.30; 60 x 2048
# (120 Ki elements, over the limit) 11.17 / 11.33 / 11.44 / 13.86 against
# 6.56 / 8.78 / 7.41 / 9.42. The element limit lies between 48 Ki (faster)
# and 120 Ki (slower); 64 Ki is not a measured crossing point.
FUSED_GATE_MAX_TOKENS = 256
FUSED_GATE_MAX_WEIGHT = 64 * 1024
# Elements of W's [BLOCK_E, BLOCK_H] tile per step of gate_route's H loop
# (bounds its registers). Chosen on ad-hoc H200 timings of session 15 whose
# script was not kept (pipelined loop, 8 x 4096, T = 1, W in L2: 4.7 us with
# 4096, 3.6 with 8192, 3.3 with 16384); only 8192 is recorded (above).
_GATE_TILE = 8192


@dataclass(frozen=True)
class RoutingTargets:
    """Where one layer's routing statistics are added (device tensors).

    routed: [E] int64 tokens per expert; mass: [E] float32 sum of router
    probabilities; seq_mass: [B, E] float32 (unit last stride) the same per
    sequence; token_seq: [T] int64 sequence of each token; token_weight: [T]
    int64 0/1 or None (padding rows count 0).
    """

    routed: torch.Tensor
    mass: torch.Tensor
    seq_mass: torch.Tensor
    token_seq: torch.Tensor
    token_weight: torch.Tensor | None


@triton.jit
def row_statistics_inputs(token_seq_ptr, token_weight_ptr, row, RECORD: tl.constexpr, WEIGHTED: tl.constexpr):
    """(sequence, weight) of token row `row` for route_row's statistics
    (0 and 1 without RECORD). Apart from route_row so that a caller can
    issue these loads first, off its routing chain (kernels/moe_entry.py),
    before its PDL wait: through the L2 (kernels/pdl.py)."""
    seq = tl.full([], 0, tl.int64)
    w = tl.full([], 1, tl.int64)
    if RECORD:
        seq = tl.load(token_seq_ptr + row, cache_modifier=".cg").to(tl.int64)
        if WEIGHTED:
            w = tl.load(token_weight_ptr + row, cache_modifier=".cg").to(tl.int64)
    return seq, w


@triton.jit
def route_row(
    logits,  # [BLOCK_E] float32, -inf past E
    row,  # int64 token row
    ids_ptr,  # [T, K] int64 out
    weights_ptr,  # [T, K] float32 out
    routed_ptr, mass_ptr, seq_mass_ptr, stride_seq,
    seq, w,  # the row's sequence and weight (row_statistics_inputs)
    E,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RECORD: tl.constexpr,
):
    """Softmax, top-k, renormalisation and statistics of one token row's
    logits (route, gate_route and kernels/moe_entry.py). Returns the row's
    top-k expert ids, int32 [BLOCK_K] (entries past K are 0)."""
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    num = tl.exp(logits - tl.max(logits, axis=0))
    probs = num / tl.sum(num, axis=0)  # [BLOCK_E], 0 past E
    kk = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), tl.float32)
    top_i = tl.zeros((BLOCK_K,), tl.int32)
    left = tl.where(emask, probs, -1.0)
    for j in tl.static_range(K):
        best = tl.max(left, axis=0)
        idx = tl.min(tl.where(left == best, e, BLOCK_E), axis=0)  # lowest index among equals
        top_w = tl.where(kk == j, best, top_w)
        top_i = tl.where(kk == j, idx, top_i)
        left = tl.where(e == idx, -2.0, left)
    kmask = kk < K
    tl.store(ids_ptr + row * K + kk, top_i.to(tl.int64), mask=kmask)
    tl.store(weights_ptr + row * K + kk, top_w / tl.sum(top_w, axis=0), mask=kmask)
    if RECORD:
        tl.atomic_add(routed_ptr + top_i, tl.zeros((BLOCK_K,), tl.int64) + w, mask=kmask, sem="relaxed")
        pw = probs * w.to(tl.float32)
        tl.atomic_add(mass_ptr + e, pw, mask=emask, sem="relaxed")
        tl.atomic_add(seq_mass_ptr + seq * stride_seq + e, pw, mask=emask, sem="relaxed")
    return top_i


@triton.jit
def _route_kernel(
    logits_ptr,  # [T, E] any float dtype, row stride stride_l
    ids_ptr,  # [T, K] int64 out
    weights_ptr,  # [T, K] float32 out
    routed_ptr, mass_ptr, seq_mass_ptr, token_seq_ptr, token_weight_ptr, stride_seq,
    E, stride_l,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RECORD: tl.constexpr, WEIGHTED: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_grid(PDL)
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    seq, w = row_statistics_inputs(token_seq_ptr, token_weight_ptr, row, RECORD, WEIGHTED)
    logits = tl.load(logits_ptr + row * stride_l + e, mask=e < E, other=float("-inf")).to(tl.float32)
    route_row(logits, row, ids_ptr, weights_ptr, routed_ptr, mass_ptr, seq_mass_ptr, stride_seq, seq, w,
              E, K, BLOCK_E, BLOCK_K, RECORD)


@triton.jit
def _gate_route_kernel(
    x_ptr,  # [T, H] float, row stride stride_x
    w_ptr,  # [E, H] x's dtype, contiguous
    ids_ptr,  # [T, K] int64 out
    weights_ptr,  # [T, K] float32 out
    routed_ptr, mass_ptr, seq_mass_ptr, token_seq_ptr, token_weight_ptr, stride_seq,
    E, H, stride_x,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    RECORD: tl.constexpr, WEIGHTED: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_grid(PDL)
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    seq, w = row_statistics_inputs(token_seq_ptr, token_weight_ptr, row, RECORD, WEIGHTED)
    acc = tl.zeros((BLOCK_E,), tl.float32)
    # Multiply-and-sum, not tl.dot: E can be below tl.dot's 16-row minimum,
    # and the interpreter mishandles bf16 dots. The loop is latency-bound (one
    # program streams all of W): its loads are pipelined (an ad-hoc H200
    # timing of session 15, not recorded: 7.6 -> 4.7 us for 8 x 4096,
    # statistics off).
    for h0 in tl.range(0, H, BLOCK_H, num_stages=3):
        h = h0 + tl.arange(0, BLOCK_H)
        hmask = h < H
        xv = tl.load(x_ptr + row * stride_x + h, mask=hmask, other=0.0).to(tl.float32)  # [BLOCK_H]
        wv = tl.load(w_ptr + e[:, None] * H + h[None, :],
                     mask=emask[:, None] & hmask[None, :], other=0.0).to(tl.float32)  # [BLOCK_E, BLOCK_H]
        acc += tl.sum(wv * xv[None, :], axis=1)
    # Round as nn.Linear's output is, so the routing sees the logits route() would.
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    route_row(tl.where(emask, logits, float("-inf")), row, ids_ptr, weights_ptr,
              routed_ptr, mass_ptr, seq_mass_ptr, stride_seq, seq, w, E, K, BLOCK_E, BLOCK_K, RECORD)


def _statistics_args(targets: RoutingTargets | None, num_experts: int, t: int,
                     ids: torch.Tensor, weights: torch.Tensor) -> tuple[tuple, dict]:
    """Checks targets; returns the kernels' statistics arguments (unused placeholders when None)."""
    if targets is None:
        return (ids, weights, weights, ids, ids, 0), dict(RECORD=False, WEIGHTED=False)
    if targets.routed.shape != (num_experts,) or targets.mass.shape != (num_experts,):
        raise ValueError("routing targets must hold one entry per expert")
    if targets.seq_mass.dim() != 2 or targets.seq_mass.shape[1] != num_experts or targets.seq_mass.stride(1) != 1:
        raise ValueError("seq_mass must be [B, E] with unit last stride")
    if targets.token_seq.shape != (t,):
        raise ValueError("token_seq must hold one sequence index per token")
    tw = targets.token_weight
    args = (targets.routed, targets.mass, targets.seq_mass, targets.token_seq, ids if tw is None else tw,
            targets.seq_mass.stride(0))
    return args, dict(RECORD=True, WEIGHTED=tw is not None)


def _check_top_k(top_k: int, num_experts: int) -> None:
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")


def route(router_logits: torch.Tensor, top_k: int, targets: RoutingTargets | None = None,
          pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [T, k] int64, topk_weights [T, k] float32); adds statistics to targets.

    router_logits: [T, E] with unit last stride; pdl: kernels/pdl.py.
    """
    if router_logits.dim() != 2 or router_logits.stride(1) != 1:
        raise ValueError(f"router_logits must be [T, E] with unit last stride, got {tuple(router_logits.shape)}")
    t, num_experts = router_logits.shape
    _check_top_k(top_k, num_experts)
    device = router_logits.device
    ids = torch.empty(t, top_k, dtype=torch.int64, device=device)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=device)
    if t == 0:
        return ids, weights
    stats, flags = _statistics_args(targets, num_experts, t, ids, weights)
    _route_kernel[(t,)](
        router_logits, ids, weights, *stats, num_experts, router_logits.stride(0),
        K=top_k, BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_K=triton.next_power_of_2(top_k), **flags,
        **pdl_options(device, t, pdl),
    )
    return ids, weights


def gate_route_suits(num_tokens: int, gate_weight: torch.Tensor) -> bool:
    """Whether gate_route beats the logits GEMM + route for this many tokens
    and this gate matrix (FUSED_GATE_MAX_TOKENS, FUSED_GATE_MAX_WEIGHT)."""
    return num_tokens <= FUSED_GATE_MAX_TOKENS and gate_weight.numel() <= FUSED_GATE_MAX_WEIGHT


def gate_route(x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, targets: RoutingTargets | None = None,
               pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor]:
    """route(F.linear(x, gate_weight), top_k, targets) in one launch.

    Faster than the two only for small T and W (gate_route_suits).

    x: [T, H] with unit last stride; gate_weight: [E, H] contiguous, x's dtype
    and device; pdl: kernels/pdl.py. Returns (topk_ids [T, k] int64,
    topk_weights [T, k] float32).
    """
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, H] with unit last stride, got {tuple(x.shape)}")
    t, hidden = x.shape
    if gate_weight.dim() != 2 or gate_weight.shape[1] != hidden or not gate_weight.is_contiguous():
        raise ValueError(f"gate_weight must be a contiguous [E, {hidden}], got {tuple(gate_weight.shape)}")
    if gate_weight.dtype != x.dtype or gate_weight.device != x.device or not x.is_floating_point():
        raise ValueError(f"x and gate_weight must share one float dtype and device, got "
                         f"{x.dtype} on {x.device} and {gate_weight.dtype} on {gate_weight.device}")
    num_experts = gate_weight.shape[0]
    _check_top_k(top_k, num_experts)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=x.device)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=x.device)
    if t == 0:
        return ids, weights
    stats, flags = _statistics_args(targets, num_experts, t, ids, weights)
    block_e = triton.next_power_of_2(num_experts)
    block_h = max(16, min(triton.next_power_of_2(hidden), _GATE_TILE // block_e))
    _gate_route_kernel[(t,)](
        x, gate_weight, ids, weights, *stats, num_experts, hidden, x.stride(0),
        K=top_k, BLOCK_E=block_e, BLOCK_H=block_h, BLOCK_K=triton.next_power_of_2(top_k), **flags,
        **pdl_options(x.device, t, pdl),
    )
    return ids, weights


def route_reference(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mixtral routing in plain torch: softmax over all experts in float32, top-k, renormalise.

    router_logits: [T, E]. Returns (probs [T, E] float32, topk_ids [T, k]
    int64, topk_weights [T, k] float32 summing to 1 per token).
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return probs, topk_ids, topk_weights


def gate_route_reference(x: torch.Tensor, gate_weight: torch.Tensor,
                         top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What gate_route computes, in plain torch: route_reference of nn.Linear's logits.

    x: [T, H]; gate_weight: [E, H]. Returns (probs [T, E], topk_ids [T, k], topk_weights [T, k]).
    """
    return route_reference(torch.nn.functional.linear(x, gate_weight), top_k)
