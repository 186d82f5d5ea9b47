"""MoE router in one launch: softmax, top-k, renormalise, routing statistics.

Plain torch spends ~10 launches per layer here (cast, softmax, top-k's gather
and sort, sum, divide, and the statistics' scatter/index adds). One program
per token row does all of it; the statistics are added with atomics (their
float sums are order-dependent in the last bits; they are telemetry, not
model output).

Numerics of the routing match route_reference (Mixtral's order): float32
softmax over all experts, the k largest probabilities (lowest index first on
ties), divided by their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


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
def _route_kernel(
    logits_ptr,  # [T, E] any float dtype, row stride stride_l
    ids_ptr,  # [T, K] int64 out
    weights_ptr,  # [T, K] float32 out
    routed_ptr, mass_ptr, seq_mass_ptr, token_seq_ptr, token_weight_ptr,
    E, stride_l, stride_seq,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    RECORD: tl.constexpr, WEIGHTED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    logits = tl.load(logits_ptr + row * stride_l + e, mask=emask, other=float("-inf")).to(tl.float32)
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
        if WEIGHTED:
            w = tl.load(token_weight_ptr + row)
        else:
            w = tl.full([], 1, tl.int64)
        seq = tl.load(token_seq_ptr + row)
        tl.atomic_add(routed_ptr + top_i, tl.zeros((BLOCK_K,), tl.int64) + w, mask=kmask, sem="relaxed")
        pw = probs * w.to(tl.float32)
        tl.atomic_add(mass_ptr + e, pw, mask=emask, sem="relaxed")
        tl.atomic_add(seq_mass_ptr + seq * stride_seq + e, pw, mask=emask, sem="relaxed")


def route(router_logits: torch.Tensor, top_k: int,
          targets: RoutingTargets | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [T, k] int64, topk_weights [T, k] float32); adds statistics to targets.

    router_logits: [T, E] with unit last stride.
    """
    if router_logits.dim() != 2 or router_logits.stride(1) != 1:
        raise ValueError(f"router_logits must be [T, E] with unit last stride, got {tuple(router_logits.shape)}")
    t, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
    device = router_logits.device
    ids = torch.empty(t, top_k, dtype=torch.int64, device=device)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=device)
    if t == 0:
        return ids, weights
    if targets is not None:
        if targets.routed.shape != (num_experts,) or targets.mass.shape != (num_experts,):
            raise ValueError("routing targets must hold one entry per expert")
        if targets.seq_mass.dim() != 2 or targets.seq_mass.shape[1] != num_experts or targets.seq_mass.stride(1) != 1:
            raise ValueError("seq_mass must be [B, E] with unit last stride")
        if targets.token_seq.shape != (t,):
            raise ValueError("token_seq must hold one sequence index per token")
    tg = targets
    _route_kernel[(t,)](
        router_logits, ids, weights,
        tg.routed if tg else ids, tg.mass if tg else weights, tg.seq_mass if tg else weights,
        tg.token_seq if tg else ids, tg.token_weight if tg and tg.token_weight is not None else ids,
        num_experts, router_logits.stride(0), tg.seq_mass.stride(0) if tg else 0,
        K=top_k, BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_K=triton.next_power_of_2(top_k),
        RECORD=tg is not None, WEIGHTED=tg is not None and tg.token_weight is not None,
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
