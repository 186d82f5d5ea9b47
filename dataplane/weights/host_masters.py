"""HostMasters: every expert block's master copy (all five fields) on the host.

The weight store copies a view's leading fields from here into arena pages
(promotions) and, for a host-only block, points the kernels at these pages
themselves (docs/WEIGHT_LAYOUT.md, "Host pages"): so a field's host bytes are
laid out exactly as in the arena, in pages of the arena's size, zero-padded.
"""

from __future__ import annotations

import torch

from dataplane.weights.codec import BlockBytes
from dataplane.weights.host_pages import HostPagePool
from dataplane.weights.layout import NUM_FIELDS, field_size, pages_for


class HostMasters:
    """Masters of blocks 0, 1, ... in the order ``add`` received them."""

    def __init__(self, page_bytes: int, pin: bool, align_to: int) -> None:
        """pin: page-lock (and map) the host pages, for a GPU store; align_to:
        the arena's base address (HostPagePool)."""
        self.page_bytes = page_bytes
        self._pool = HostPagePool(page_bytes, pin=pin, align_to=align_to)
        self._shapes: list[tuple[int, int]] = []
        self._pages: list[list[torch.Tensor]] = []  # [block][field] -> uint8 [pages, page_bytes]

    def add(self, blk: BlockBytes) -> None:
        """Copies one encoded block's fields in (the encoded form may be dropped after)."""
        fields = []
        for f in range(NUM_FIELDS):
            data = blk.field_bytes(f)  # uint8 [nbytes] on the encoder's device
            pages = self._pool.take(pages_for(data.numel(), self.page_bytes))  # [pages, page_bytes], zeroed
            pages.view(-1)[: data.numel()].copy_(data)
            fields.append(pages)
        self._shapes.append((blk.n, blk.k))
        self._pages.append(fields)

    def pages(self, block: int, f: int) -> torch.Tensor:
        """uint8 [pages, page_bytes]: field ``f`` of ``block``, zero-padded."""
        return self._pages[block][f]

    def field_bytes(self, block: int, f: int) -> torch.Tensor:
        """uint8 [bytes]: field ``f`` of ``block`` (codes, then view-f scales)."""
        n, k = self._shapes[block]
        return self._pages[block][f].reshape(-1)[: field_size(n, k, f).total]

    def master_bytes(self, block: int) -> int:
        """Bytes a kernel reads for one use of ``block`` at the master view:
        every field's codes and the last field's scales."""
        n, k = self._shapes[block]
        codes = sum(field_size(n, k, f).code_bytes for f in range(NUM_FIELDS))
        return codes + field_size(n, k, NUM_FIELDS - 1).scale_bytes

    def page_rows(self, max_pages: int, arena_pages: int, device: torch.device) -> torch.Tensor:
        """int64 [blocks, fields, max_pages] on ``device``: each field's host
        pages as page offsets from the arena's base (-1 past the field's
        pages). An offset in [0, arena_pages), or -1, would alias an arena
        page or the absent mark; the two address ranges never meet, which
        this checks."""
        rows = torch.full((len(self._pages), NUM_FIELDS, max_pages), -1, dtype=torch.int64)
        for b, fields in enumerate(self._pages):
            for f, pages in enumerate(fields):
                first, n = self._pool.page_offset(pages), pages.shape[0]
                if first + n > -1 and first < arena_pages:
                    raise RuntimeError(f"host pages of block {b} meet the arena's page range")
                rows[b, f, :n] = torch.arange(first, first + n)
        return rows.to(device)
