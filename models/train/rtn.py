"""Round-to-nearest (RTN) weight quantization, asymmetric min-max, in groups
along the input dimension — the static baseline the precision policy must beat.

Per (row, group of ``group`` consecutive inputs): lo = min, hi = max,
s = (hi - lo) / (2^bits - 1) (s = 1 when hi == lo), q = clamp(round((w - lo) / s),
0, 2^bits - 1), and the reconstruction is lo + s * q. At 8 bits this is exactly
the code of docs/WEIGHT_LAYOUT.md.
"""

from __future__ import annotations

import torch

GROUP = 128
EXPERT_MARKER = ".experts."  # parameter names of expert weights (fused or per-expert layout)


def quantize_rtn(weight: torch.Tensor, bits: int, group: int = GROUP) -> torch.Tensor:
    """Fake-quantizes ``weight`` [..., K] (K = input dim, multiple of ``group``);
    returns the dequantized tensor in the same shape and dtype."""
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in 1..16, got {bits}")
    *lead, k = weight.shape
    if k % group:
        raise ValueError(f"input dim {k} is not a multiple of the group size {group}")
    w = weight.float().reshape(*lead, k // group, group)  # [..., G, group]
    lo = w.amin(dim=-1, keepdim=True)  # [..., G, 1]
    hi = w.amax(dim=-1, keepdim=True)  # [..., G, 1]
    levels = 2**bits - 1
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round((w - lo) / scale), 0, levels)
    return (lo + q * scale).reshape(weight.shape).to(weight.dtype)


def expert_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The model's expert weight matrices by name (router and attention excluded)."""
    found = {name: p for name, p in model.named_parameters() if EXPERT_MARKER in name and p.ndim >= 2}
    if not found:
        raise ValueError("model has no expert parameters (names containing '.experts.')")
    return found


@torch.no_grad()
def quantize_experts_(model: torch.nn.Module, bits: int, group: int = GROUP) -> dict[str, float]:
    """Replaces every expert weight in place by its RTN reconstruction; returns
    the relative Frobenius error ||W - Q(W)|| / ||W|| per parameter name."""
    errors = {}
    for name, param in expert_parameters(model).items():
        deq = quantize_rtn(param.data, bits, group)
        errors[name] = float((deq.float() - param.data.float()).norm() / param.data.float().norm())
        param.data.copy_(deq)
    return errors
