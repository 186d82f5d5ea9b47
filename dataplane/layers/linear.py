"""Bias-free linear and embedding layers with uninitialised weights.

The loader or the synthetic initialiser fills every weight, so construction
does no random init (nn.Linear's would cost seconds on real model sizes).
Parameter names match nn.Linear / nn.Embedding (``weight``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.skinny_linear import SKINNY_DTYPES, skinny_linear


def project(x: torch.Tensor, weight: torch.Tensor, skinny_max_tokens: int,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T -> [T, N] in out_dtype (x's by default).

    On CUDA, fp16/bf16 batches of 1..skinny_max_tokens rows take the
    one-pass skinny kernel (kernels/skinny_linear.py: W read once, no split-K
    reduce); larger batches, other dtypes and devices, and 0 take torch's GEMM.
    """
    if (x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= skinny_max_tokens and x.stride(-1) == 1
            and x.dtype in SKINNY_DTYPES and weight.dtype == x.dtype):
        return skinny_linear(x, weight, out_dtype)
    y = F.linear(x, weight)
    return y if out_dtype is None else y.to(out_dtype)


class Linear(nn.Module):
    """y = x @ weight.T with weight [out_features, in_features].

    skinny_max_tokens: batches up to this many rows use the decode kernel on
    CUDA (see ``project``); 0 (the default) keeps torch's GEMM. Set by the
    model's ``use_skinny_linear`` transform.
    """

    def __init__(self, in_features: int, out_features: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.skinny_max_tokens = 0
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in_features] -> [T, out_features]
        return project(x, self.weight, self.skinny_max_tokens)


class Embedding(nn.Module):
    """Row lookup in weight [vocab, hidden]."""

    def __init__(self, vocab_size: int, hidden_size: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, device=device, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] int64 -> [T, hidden]
        return F.embedding(ids, self.weight)
