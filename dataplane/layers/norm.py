"""RMSNorm as Mixtral (and Llama) define it."""

from __future__ import annotations

import torch
from torch import nn

from kernels.pdl import DEFAULT_PDL
from kernels.rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_reference


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), the statistics in float32.

    The normalised activations are cast back to the input dtype before the
    weight multiplies them (the order transformers uses, so logits match).
    On CUDA one fused Triton launch (kernels/rmsnorm.py), else plain torch.
    pdl: which of its launches take part in PDL (kernels/pdl.py; set by the
    model's use_pdl transform from DataplaneConfig.pdl_max_rows).
    """

    def __init__(self, hidden_size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.pdl = DEFAULT_PDL
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, hidden]
        if x.is_cuda and x.dtype == self.weight.dtype:
            return rmsnorm(x, self.weight, self.eps, self.pdl)
        return rmsnorm_reference(x, self.weight, self.eps)

    def add_forward(self, delta: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + delta, its norm): the residual add fused into the norm's launch.

        delta may be float32 where residual is not (the fused MoE kernel's
        accumulator): it is rounded to residual's dtype before the add."""
        # delta, residual: [tokens, hidden]
        if residual.is_cuda and residual.dtype == self.weight.dtype and delta.dtype in (residual.dtype, torch.float32):
            return add_rmsnorm(delta, residual, self.weight, self.eps, self.pdl)
        total = residual + delta.to(residual.dtype)
        return total, rmsnorm_reference(total, self.weight, self.eps)
