"""Builds small paged weight stores for kernel tests, allocating pages from the
real arena (shuffled so that no field is contiguous)."""

from __future__ import annotations

import torch

from dataplane.memory.arena import Arena, PageTag
from kernels import weight_layout as wl
from kernels.moe_mixed import PagedWeights


def build_store(shapes_fields: list[tuple[list[torch.Tensor], int]], page_bytes: int,
                device: str, seed: int = 0) -> tuple[PagedWeights, Arena]:
    """shapes_fields: per block (its five byte strings, resident field count)."""
    need = sum(wl.pages_for(f.numel(), page_bytes) for fields, nf in shapes_fields for f in fields[:nf])
    arena = Arena(need + 7, page_bytes, device=device)
    gen = torch.Generator().manual_seed(seed)
    # Take the pages from the arena, then hand them to fields in a shuffled order.
    pool = arena.alloc(need, PageTag("weight", 8))
    order = [pool[i] for i in torch.randperm(len(pool), generator=gen).tolist()]
    arena.storage.fill_(0xAB)  # garbage outside the written bytes

    def alloc(n: int) -> list[int]:
        return [order.pop() for _ in range(n)]

    pt, bf = wl.place_blocks([f for f, _ in shapes_fields], [nf for _, nf in shapes_fields],
                             arena.storage, alloc)
    return PagedWeights(arena.storage, pt, bf), arena


def random_moe(num_layers: int, num_experts: int, hidden: int, ffn: int, fields_of, page_bytes: int,
               device: str, seed: int = 0) -> PagedWeights:
    """Random experts; fields_of(layer, expert, proj) -> resident field count."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for layer in range(num_layers):
        for e in range(num_experts):
            for proj in range(3):
                n, k = (ffn, hidden) if proj < 2 else (hidden, ffn)
                w = torch.randn(n, k, generator=gen) * (0.5 / k**0.5)
                blocks.append((wl.pack_block(w), fields_of(layer, e, proj)))
    weights, _ = build_store(blocks, page_bytes, device, seed)
    return weights
