"""Shared helpers for the weight-store tests."""

from __future__ import annotations

import torch

from dataplane.memory.arena import Arena
from dataplane.weights.codec import EncodedBlock, decode
from dataplane.weights.copy_engine import Copy
from dataplane.weights.layout import VIEW_BITS

POISON = 0xA5  # written into destination pages at submit, so an early read shows


class HeldBatch:
    """One submitted batch of copies that lands only when told to (or waited on)."""

    def __init__(self, copies: list[Copy]) -> None:
        self.copies = copies
        self.landed = False
        for dst, _ in copies:
            dst.fill_(POISON)

    def land(self) -> None:
        for dst, src in self.copies:
            dst.copy_(src)
        self.landed = True

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:
        if not self.landed:
            self.land()


class HeldCopyEngine:
    """A copy engine whose transfers stay in flight until ``land`` (a slow PCIe link)."""

    def __init__(self) -> None:
        self.batches: list[HeldBatch] = []

    def submit(self, copies: list[Copy]) -> HeldBatch:
        batch = HeldBatch(list(copies))
        self.batches.append(batch)
        return batch

    def in_flight(self) -> list[HeldBatch]:
        return [b for b in self.batches if not b.landed]

    def land_all(self) -> None:
        for batch in self.in_flight():
            batch.land()


def random_block_matrix(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * 0.02


def expected_view(block: EncodedBlock, bits: int) -> torch.Tensor:
    """What a reader must see for a block at committed ``bits`` (host-only reads the master view)."""
    return decode(block, bits if bits else VIEW_BITS[-1])


def arena_for(pages: int, page_bytes: int = 256) -> Arena:
    return Arena(pages, page_bytes)
