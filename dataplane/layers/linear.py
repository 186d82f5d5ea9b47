"""Bias-free linear and embedding layers with uninitialised weights.

The loader or the synthetic initialiser fills every weight, so construction
does no random init (nn.Linear's would cost seconds on real model sizes).
Parameter names match nn.Linear / nn.Embedding (``weight``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.dense_gemv import GEMV_DTYPES, GemvTiles, dense_gemv
from kernels.dense_mma import MmaTiles, dense_mma
from kernels.pdl import DEFAULT_PDL


class Linear(nn.Module):
    """y = x @ weight.T with weight [out_features, in_features].

    gemv_max_tokens: on CUDA, fp16/bf16 batches of 1..gemv_max_tokens rows
    take kernels/dense_gemv.py (a GEMV taking part in PDL, so its programs
    become resident under the previous launch); 0 (the default) keeps torch's
    GEMM. Set by a model's use_dense_gemv transform
    (DataplaneConfig.dense_gemv_max_tokens).
    gemv_tiles: that GEMV's launch shape (None: its default).
    mma_max_tokens: likewise, batches of gemv_max_tokens + 1..mma_max_tokens
    rows take kernels/dense_mma.py (a tensor-core product taking part in
    PDL); 0 (the default) keeps torch's GEMM. Set by use_dense_mma
    (DataplaneConfig.dense_mma_max_tokens).
    mma_tiles: that kernel's launch shape (None: its default).
    pdl: which of its launches take part in PDL (kernels/pdl.py; set by the
    model's use_pdl transform from DataplaneConfig.pdl_max_rows).
    """

    def __init__(self, in_features: int, out_features: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.gemv_max_tokens = 0
        self.gemv_tiles: GemvTiles | None = None
        self.mma_max_tokens = 0
        self.mma_tiles: MmaTiles | None = None
        self.pdl = DEFAULT_PDL
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in_features] -> [T, out_features]
        tokens = x.shape[0]
        if 0 < tokens <= max(self.gemv_max_tokens, self.mma_max_tokens) and self._kernel_suits(x):
            if tokens <= self.gemv_max_tokens:
                return dense_gemv(x, self.weight, self.gemv_tiles, pdl=self.pdl)
            return dense_mma(x, self.weight, self.mma_tiles, pdl=self.pdl)
        return F.linear(x, self.weight)

    def _kernel_suits(self, x: torch.Tensor) -> bool:
        # The decode kernels' contract: CUDA, 2-d, unit last stride, the weight's fp16/bf16.
        return (x.is_cuda and x.dim() == 2 and x.stride(-1) == 1 and x.dtype in GEMV_DTYPES
                and x.dtype == self.weight.dtype)


class Embedding(nn.Module):
    """Row lookup in weight [vocab, hidden]."""

    def __init__(self, vocab_size: int, hidden_size: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, device=device, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] int64 -> [T, hidden]
        return F.embedding(ids, self.weight)
