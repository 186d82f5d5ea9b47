"""The experts of one MoE layer, behind a narrow interface.

Interface (any implementation, e.g. the multi-precision paged one, must keep
it so it can replace ``DenseExperts`` in a loaded model, gpt-fast style):

    forward(x [T, H], topk_ids [T, k] int64, topk_weights [T, k] float32) -> [T, H]

    out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(w1[e] @ x[t]) * (w3[e] @ x[t])),
    e = topk_ids[t, j], computed in x's dtype and returned in x's dtype.

An implementation may also take the MoE block's entry over (the residual add
and norm before the layer and the router), one launch where the kernels
allow it; it then has the methods of ``ExpertsWithEntry``.

``DenseExperts`` holds the weights as three stacked parameters in nn.Linear
layout (out_features x in_features):
    w1: [E, F, H] gate, w3: [E, F, H] up, w2: [E, H, F] down.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kernels.router import RoutingTargets


class Experts(Protocol):
    """What the MoE block calls; see the module docstring for the contract."""

    num_experts: int

    def __call__(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor: ...


class ExpertsWithEntry(Protocol):
    """Experts that can also do the MoE block's entry (SparseMoeBlock.add_norm_forward)."""

    def entry_ready(self, num_tokens: int, top_k: int, gate_weight: torch.Tensor) -> bool:
        """Whether forward_from_residual can run now for this many tokens."""
        ...

    def forward_from_residual(
        self, delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
        gate_weight: torch.Tensor, top_k: int, targets: RoutingTargets | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts' output for x = RMSNorm(residual + delta; norm_weight, eps)
        routed by softmax-top-k of x @ gate_weight.T (statistics added to
        targets), residual + delta)."""
        ...


class DenseExperts(nn.Module):
    """Full-precision experts: loops over the experts that received tokens."""

    def __init__(
        self, num_experts: int, hidden_size: int, ffn_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.ffn_size = ffn_size
        # Uninitialised: a checkpoint or the synthetic initialiser fills them.
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size, device=device, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        # x: [T, H]; topk_ids: [T, k] int64; topk_weights: [T, k] float32
        top_k = topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1)  # [T * k]
        order = torch.argsort(flat_ids, stable=True)  # [T * k], grouped by expert
        token_of = order // top_k  # [T * k] token row of each sorted assignment
        weight_of = topk_weights.reshape(-1)[order]  # [T * k]
        # One host sync per layer: which experts have tokens and how many.
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        out = torch.zeros_like(x)  # [T, H]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = token_of[start : start + count]  # [n]
            xe = x[rows]  # [n, H]
            hidden = F.silu(F.linear(xe, self.w1[expert])) * F.linear(xe, self.w3[expert])  # [n, F]
            ye = F.linear(hidden, self.w2[expert])  # [n, H]
            out.index_add_(0, rows, (ye * weight_of[start : start + count, None]).to(x.dtype))
            start += count
        return out
