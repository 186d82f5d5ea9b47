"""Rotary position embedding (the "rotate half" variant of Llama/Mixtral)."""

from __future__ import annotations

import torch
from torch import nn

from kernels.paged_attention import write_kv_cache
from kernels.rotary import apply_rotary, rotary_reference
from kernels.pdl import DEFAULT_PDL
from kernels.rotary_cache_write import rotary_cache_write


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by angles ``position * theta^(-2i/head_dim)``.

    cos/sin are computed per step from the positions (no table of
    max_position_embeddings rows), in float32 and cast to the activations'
    dtype, exactly as transformers does, so the torch path (CPU) matches its
    logits bit for bit in fp32. On CUDA one Triton launch rotates q and k
    (kernels/rotary.py; its cos/sin may differ from torch's in the last ulp).
    pdl: which of its launches take part in PDL (kernels/pdl.py; set by the
    model's use_pdl transform from DataplaneConfig.pdl_max_rows).
    """

    def __init__(self, head_dim: int, theta: float, device: torch.device) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        self.pdl = DEFAULT_PDL
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        # [head_dim / 2]
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [tokens] int64; q: [tokens, heads, head_dim]; k: [tokens, kv_heads, head_dim]
        if q.is_cuda:
            return apply_rotary(positions, self.inv_freq, q, k)
        return rotary_reference(positions, self.inv_freq, q, k)

    def rotate_into_cache(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """Rotated q; the rotated k and v stored at their slots of ``layer`` in
        the KV arena view (kernels/paged_attention.kv_cache_view). On CUDA one
        launch (kernels/rotary_cache_write.py), else as forward + write_kv_cache."""
        # q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64
        if q.is_cuda:
            return rotary_cache_write(positions, self.inv_freq, q, k, v, kv_cache, layer, slot_mapping, self.pdl)
        q, k = self.forward(positions, q, k)
        write_kv_cache(k, v, kv_cache, layer, slot_mapping)
        return q
