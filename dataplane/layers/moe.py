"""Sparse MoE block as Mixtral defines it: router, top-k, renormalise, experts."""

from __future__ import annotations

import torch
from torch import nn

from dataplane.layers.experts import DenseExperts, Experts, ExpertsWithEntry
from dataplane.layers.linear import Linear
from dataplane.layers.norm import RMSNorm
from dataplane.routing_stats import RoutingStats
from kernels.pdl import DEFAULT_PDL
from kernels.router import gate_route, gate_route_suits, route, route_reference


class SparseMoeBlock(nn.Module):
    """Router + experts of one decoder layer.

    ``experts`` is any module with the interface of
    ``dataplane.layers.experts`` and can be swapped after loading (e.g. for the
    multi-precision paged implementation).
    """

    def __init__(
        self,
        layer_index: int,
        hidden_size: int,
        ffn_size: int,
        num_experts: int,
        top_k: int,
        device: torch.device,
        dtype: torch.dtype,
        expert_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
        self.layer_index = layer_index
        self.top_k = top_k
        self.pdl = DEFAULT_PDL  # the router's launches (kernels/pdl.py; the model's use_pdl)
        self.gate = Linear(hidden_size, num_experts, device, dtype)
        self.experts: Experts = DenseExperts(
            num_experts, hidden_size, ffn_size, device if expert_device is None else expert_device, dtype
        )

    def add_norm_forward(self, delta: torch.Tensor, residual: torch.Tensor, norm: RMSNorm,
                         routing: RoutingStats | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(residual + delta)), residual + delta): the block with the
        residual add and norm before it. Experts that can (ExpertsWithEntry,
        e.g. the fused paged kernels at decode sizes) do the add, the norm and
        the router in their first launch; else norm.add_forward, then forward."""
        # delta, residual: [T, H]
        # Duck-typed, not isinstance: a runtime Protocol check costs 4-8 us of
        # host time per call (measured on the CPU), once per layer and step.
        entry_ready = getattr(self.experts, "entry_ready", None)
        if entry_ready is not None and entry_ready(delta.shape[0], self.top_k, self.gate.weight):
            experts: ExpertsWithEntry = self.experts  # type: ignore[assignment]
            targets = routing.targets(self.layer_index) if routing is not None else None
            return experts.forward_from_residual(delta, residual, norm.weight, norm.eps, self.gate.weight,
                                                 self.top_k, targets)
        residual, normed = norm.add_forward(delta, residual)
        return self(normed, routing), residual

    def forward(self, x: torch.Tensor, routing: RoutingStats | None) -> torch.Tensor:
        # x: [T, H]
        if x.is_cuda:
            # One launch for softmax, top-k, renormalisation and the statistics;
            # at decode sizes and for a small router it computes the gate
            # logits too (self.gate has no bias).
            targets = routing.targets(self.layer_index) if routing is not None else None
            if gate_route_suits(x.shape[0], self.gate.weight):
                topk_ids, topk_weights = gate_route(x, self.gate.weight, self.top_k, targets, self.pdl)
            else:
                router_logits = self.gate(x)  # [T, E]
                topk_ids, topk_weights = route(router_logits, self.top_k, targets, self.pdl)
        else:
            router_logits = self.gate(x)  # [T, E]
            probs, topk_ids, topk_weights = route_reference(router_logits, self.top_k)
            if routing is not None:
                routing.record(self.layer_index, topk_ids, probs)
        return self.experts(x, topk_ids, topk_weights)  # [T, H]
