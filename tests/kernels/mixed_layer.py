"""The small mixed-bits MoE layer several kernel tests share: its shapes, the
resident field count of each block (every view, expert 4 host-only) and the
relative error they compare with."""

from __future__ import annotations

import torch

H, F, E = 256, 384, 5
PAGE = 8192  # 64-row tiles of the down blocks (6 KiB) straddle pages
FIELDS = [5, 1, 3, 2, 4, 3, 1, 5, 2, 4, 4, 2, 3, 5, 1]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def mixed_fields(layer: int, e: int, proj: int) -> int:
    """Resident fields of block (layer, expert e, projection proj)."""
    if e == 4:
        return 0  # host-only expert
    return FIELDS[(e * 3 + proj + layer) % len(FIELDS)]
