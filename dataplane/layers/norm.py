"""RMSNorm as Mixtral (and Llama) define it."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), the statistics in float32.

    The normalised activations are cast back to the input dtype before the
    weight multiplies them (the order transformers uses, so logits match).
    """

    def __init__(self, hidden_size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, hidden]
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)  # [tokens, 1]
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)
