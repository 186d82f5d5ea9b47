"""Rotary position embedding (the "rotate half" variant of Llama/Mixtral)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by angles ``position * theta^(-2i/head_dim)``.

    cos/sin are computed per step from the positions (no table of
    max_position_embeddings rows), in float32 and cast to the activations'
    dtype, exactly as transformers does, so logits match bit for bit in fp32.
    """

    def __init__(self, head_dim: int, theta: float, device: torch.device) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        # [head_dim / 2]
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [tokens] int64; q: [tokens, heads, head_dim]; k: [tokens, kv_heads, head_dim]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [tokens, head_dim / 2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [tokens, head_dim]
        cos = angles.cos().to(q.dtype)[:, None, :]  # [tokens, 1, head_dim]
        sin = angles.sin().to(q.dtype)[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_dim] -> [-x2, x1]
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
