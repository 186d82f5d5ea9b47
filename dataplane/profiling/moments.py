"""Second moments of the expert blocks' inputs, recorded during forward passes.

``RecordingExperts`` wraps a layer's ``DenseExperts`` (same interface, same
output) and adds, for every expert e and the tokens routed to it, into an
``ExpertMoments``:

* ``count[e]``: routed tokens (a token counts once per chosen expert);
* ``gate_sq[e]``: sum of the tokens' squared routing weights g^2;
* ``x_sum[e]`` [H, H]: sum of x x^T over the routed hidden states x (the
  input of the gate and up blocks), and ``x_g2[e]``: the same weighted by g^2;
* ``h_sum[e]`` [F, F]: sum of h h^T over the intermediates
  h = silu(W1 x) * (W3 x) (the input of the down block), ``h_g2[e]``: g^2-weighted;
* ``gate_row[e]`` [F]: sum of g^2 (dh_f / da_f)^2 with a = W1 x (how an error in
  gate row f reaches h), ``up_row[e]`` [F]: sum of g^2 silu(a_f)^2 (the same
  for up row f).

Sums are float64 (millions of rows are added). Costs built from them live in
sensitivity.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dataplane.layers.experts import DenseExperts


class ExpertMoments:
    """Accumulators of one MoE layer (see module doc)."""

    def __init__(self, num_experts: int, hidden: int, ffn: int) -> None:
        f64 = torch.float64
        self.count = torch.zeros(num_experts, dtype=torch.int64)  # [E]
        self.gate_sq = torch.zeros(num_experts, dtype=f64)  # [E]
        self.x_sum = torch.zeros(num_experts, hidden, hidden, dtype=f64)  # [E, H, H]
        self.x_g2 = torch.zeros(num_experts, hidden, hidden, dtype=f64)  # [E, H, H]
        self.h_sum = torch.zeros(num_experts, ffn, ffn, dtype=f64)  # [E, F, F]
        self.h_g2 = torch.zeros(num_experts, ffn, ffn, dtype=f64)  # [E, F, F]
        self.gate_row = torch.zeros(num_experts, ffn, dtype=f64)  # [E, F]
        self.up_row = torch.zeros(num_experts, ffn, dtype=f64)  # [E, F]

    def add(self, expert: int, x: torch.Tensor, gate_pre: torch.Tensor, up_pre: torch.Tensor,
            g: torch.Tensor) -> None:
        """x: [n, H] routed inputs; gate_pre = W1 x, up_pre = W3 x: [n, F];
        g: [n] routing weights. All float32 (any float dtype is accepted)."""
        x, a, u, g = x.double(), gate_pre.double(), up_pre.double(), g.double()
        g2 = (g * g)[:, None]  # [n, 1]
        sig = torch.sigmoid(a)
        silu = a * sig  # [n, F]
        h = silu * u  # [n, F]
        d_gate = (sig * (1.0 + a * (1.0 - sig))) * u  # [n, F]: d h / d a
        self.count[expert] += x.shape[0]
        self.gate_sq[expert] += float(g2.sum())
        self.x_sum[expert] += x.T @ x
        self.x_g2[expert] += (x * g2).T @ x
        self.h_sum[expert] += h.T @ h
        self.h_g2[expert] += (h * g2).T @ h
        self.gate_row[expert] += (g2 * d_gate * d_gate).sum(dim=0)
        self.up_row[expert] += (g2 * silu * silu).sum(dim=0)


class RecordingExperts(nn.Module):
    """DenseExperts plus moment recording; the output is the wrapped module's."""

    def __init__(self, inner: DenseExperts) -> None:
        super().__init__()
        self.inner = inner
        self.num_experts = inner.num_experts
        self.moments = ExpertMoments(inner.num_experts, inner.hidden_size, inner.ffn_size)
        self.enabled = True  # False: a plain pass-through (later passes must not add moments)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        # x: [T, H]; topk_ids: [T, k] int64; topk_weights: [T, k] float32
        experts = torch.unique(topk_ids).tolist() if self.enabled else []
        for expert in experts:
            tok, slot = torch.where(topk_ids == expert)  # [n], [n]
            xe = x[tok].float()  # [n, H]
            gate_pre = F.linear(xe, self.inner.w1[expert].float())  # [n, F]
            up_pre = F.linear(xe, self.inner.w3[expert].float())  # [n, F]
            self.moments.add(expert, xe, gate_pre, up_pre, topk_weights[tok, slot].float())
        return self.inner(x, topk_ids, topk_weights)


def attach_recorders(model: nn.Module) -> list[RecordingExperts]:
    """Wraps every DenseExperts of ``model`` in place (module order = layer
    order) and returns the recorders; ValueError when there is none."""
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, DenseExperts)]
    if not targets:
        raise ValueError("the model has no DenseExperts modules to profile")
    recorders = []
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        recorder = RecordingExperts(module)
        setattr(model.get_submodule(parent_name), attr, recorder)
        recorders.append(recorder)
    return recorders
