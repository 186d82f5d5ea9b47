"""WeightStore: expert-weight blocks paged into the shared arena at per-block bitwidths.

Mechanism only (policy — which block to move and when — lives elsewhere).

Contracts:
* The host keeps every field of every block (pinned memory on a GPU); the
  arena holds the leading fields of each block's current view.
* ``page_table`` int64 [num_blocks, NUM_FIELDS, max_pages] and ``block_fields``
  int32 [num_blocks] are persistent tensors on the arena's device (kernels
  read them; they are updated in place, never reallocated). An entry is a
  page offset from the arena's base: 0 <= entry < num_pages for an arena
  page, anything else a host page of the block's master copy (pinned on a
  GPU, mapped into the device's address space; docs/WEIGHT_LAYOUT.md, "Host
  pages"). ``block_fields[b]`` is the field count kernels read: the
  resident fields, or NUM_FIELDS for a host-only block, whose rows name its
  host pages. Other entries are -1.
* Every arena page a block holds is tagged ``PageTag("weight", bits)`` with
  the block's committed bits; pages of an in-flight promotion are tagged with
  its target bits.
* ``demote`` is immediate: ``block_fields`` is lowered first, then the pages of
  the dropped fields go back to the arena.
* ``promote`` allocates pages (all or nothing: ``OutOfPages`` changes
  nothing), starts the host copy on the copy engine, and commits only when the
  copy is complete (``poll``/``sync``/readers), writing the page-table rows
  first and ``block_fields`` last. Until then readers see the old bits.
* A host-only block (bits 0) holds no arena pages and is served at the
  master (8-bit) view read in place from the host: the MoE kernels follow its
  host rows (zero-copy over PCIe, also inside CUDA graphs), ``read_view``
  copies the master from the host. So host-only costs read time, never
  quality, and never holds arena pages. ``record_use`` counts those reads.
* Not thread-safe: one engine thread drives it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import torch

from dataplane.memory.arena import Arena, OutOfPages, PageTag
from dataplane.weights.codec import BlockBytes, decode_view, field_from_bytes
from dataplane.weights.copy_engine import Copy, CopyEngine, CopyHandle, default_copy_engine
from dataplane.weights.host_masters import HostMasters
from dataplane.weights.layout import (
    HOST_ONLY_BITS,
    NUM_FIELDS,
    NUM_PROJ,
    VIEW_BITS,
    bits_for_fields,
    field_size,
    fields_for_bits,
    pages_for,
)
from dataplane.weights.recency import BlockRecency

HOST_ONLY_FIELDS = 0  # resident field count of a host-only block


@dataclass
class WeightCounters:
    """Cumulative transition counters (telemetry reports deltas of these)."""

    demotions: int = 0
    promotions: int = 0  # committed promotions, on-demand fetches excluded
    bytes_promoted: int = 0  # host -> arena bytes, page-rounded
    bytes_demoted: int = 0  # arena bytes released by demotions, page-rounded
    host_reads: int = 0  # uses of host-only blocks (each read in place from the host; record_use)
    host_read_bytes: int = 0  # master bytes those uses read over the host link


@dataclass
class _Pending:
    fields: int  # field count once committed
    pages: dict[int, list[int]]  # new field -> its arena pages
    handle: CopyHandle
    nbytes: int


@dataclass(frozen=True)
class BlockView:
    """What a reader needs to reconstruct a block at its committed bits."""

    bits: int
    codes: tuple[torch.Tensor, ...]  # field f: int32 [N, K * w_f / 32]
    scales: torch.Tensor  # fp16 [N, K / GROUP, 2] of this view


class WeightStore:
    def __init__(
        self,
        arena: Arena,
        blocks: Iterable[BlockBytes],
        *,
        initial_bits: int | Sequence[int] = VIEW_BITS[-1],
        copy_engine: CopyEngine | None = None,
    ) -> None:
        if arena.storage is None:
            raise ValueError("the weight store needs an arena with storage")
        self.arena = arena
        self.device = arena.device
        self.page_bytes = arena.page_bytes
        self._copy = copy_engine if copy_engine is not None else default_copy_engine(self.device)
        self.masters = HostMasters(self.page_bytes, pin=self.device.type == "cuda", align_to=arena.storage.data_ptr())
        self._shapes: list[tuple[int, int]] = []
        self._num_pages: list[list[int]] = []  # [block][field] -> pages of the field when resident
        for blk in blocks:  # one block at a time: the encoded form is dropped once copied
            self._shapes.append((blk.n, blk.k))
            self._num_pages.append(
                [pages_for(field_size(blk.n, blk.k, f).total, self.page_bytes) for f in range(NUM_FIELDS)]
            )
            self.masters.add(blk)
        if not self._shapes:
            raise ValueError("the weight store needs at least one block")
        max_pages = max(max(row) for row in self._num_pages)
        num = len(self._shapes)
        # [blocks, fields, max_pages] the page-table rows of each block's master on the host
        self._host_rows = self.masters.page_rows(max_pages, arena.num_pages, self.device)
        self.page_table = torch.full(
            (num, NUM_FIELDS, max_pages), -1, dtype=torch.int64, device=self.device
        )  # [blocks, fields, max_pages]
        self.block_fields = torch.zeros(num, dtype=torch.int32, device=self.device)  # [blocks]
        self._pages: list[list[list[int]]] = [[[] for _ in range(NUM_FIELDS)] for _ in range(num)]
        self._fields = [0] * num
        self._host_only = set(range(num))  # blocks with 0 resident fields (kept with _fields by _set_fields)
        self._pending: dict[int, _Pending] = {}
        self._version = [0] * num
        self.recency = BlockRecency(num)  # accesses, for the controller's fallback walk
        self.counters = WeightCounters()
        self._place_initial(initial_bits)

    # -- construction -------------------------------------------------------------
    def _show_master(self, block: int) -> None:
        """Points the kernels at the block's master on the host (it holds no
        arena pages): every field's rows, then block_fields, in stream order."""
        self.page_table[block] = self._host_rows[block]
        self.block_fields[block : block + 1] = NUM_FIELDS

    def _place_initial(self, initial_bits: int | Sequence[int]) -> None:
        bits = [initial_bits] * self.num_blocks if isinstance(initial_bits, int) else list(initial_bits)
        if len(bits) != self.num_blocks:
            raise ValueError(f"initial_bits has {len(bits)} entries for {self.num_blocks} blocks")
        need = sum(self.block_pages(b, x) for b, x in enumerate(bits))
        if need > self.arena.free_pages:
            raise OutOfPages(f"initial weights need {need} pages, arena has {self.arena.free_pages} free")
        for b, x in enumerate(bits):
            if x != HOST_ONLY_BITS:
                self.promote(b, x)
            else:
                self._show_master(b)
        self.sync()
        self.counters = WeightCounters()  # loading is not a transition

    # -- queries -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self._shapes)

    def host_only_set(self) -> frozenset[int]:
        """The blocks with no arena pages now (what a step queued now reads from the host)."""
        return frozenset(self._host_only)

    def _set_fields(self, block: int, fields: int) -> None:
        """The one place resident field counts change (keeps the host-only count)."""
        if fields == HOST_ONLY_FIELDS:
            self._host_only.add(block)
        else:
            self._host_only.discard(block)
        self._fields[block] = fields

    def shape(self, block: int) -> tuple[int, int]:
        return self._shapes[block]

    def bits(self, block: int) -> int:
        """Committed bits of ``block`` (0 = host-only); what readers use."""
        return bits_for_fields(self._fields[block])

    def block_bits(self) -> list[int]:
        """Committed bits of every block in block-index order."""
        return [bits_for_fields(n) for n in self._fields]

    def pending_bits(self, block: int) -> int | None:
        """Target bits of an in-flight promotion of ``block``, else None."""
        pending = self._pending.get(block)
        return None if pending is None else bits_for_fields(pending.fields)

    def version(self, block: int) -> int:
        """Bumped on every committed transition (cache key for decoded weights)."""
        return self._version[block]

    def resident_pages(self, block: int) -> list[int]:
        """Arena pages of the committed fields of ``block``."""
        return [p for f in range(self._fields[block]) for p in self._pages[block][f]]

    def pending_pages(self, block: int) -> list[int]:
        pending = self._pending.get(block)
        return [] if pending is None else [p for pages in pending.pages.values() for p in pages]

    def field_bytes(self, block: int, f: int) -> torch.Tensor:
        """Host master bytes of field ``f`` (layout: codes, then view-f scales). uint8 [bytes]."""
        return self.masters.field_bytes(block, f)

    def block_pages(self, block: int, bits: int) -> int:
        return sum(self._num_pages[block][: fields_for_bits(bits)])

    def footprint_bytes(self, proj: int, bits: int) -> int:
        """Arena bytes of one block of projection ``proj`` at ``bits`` (whole pages; 0 host-only)."""
        if not 0 <= proj < NUM_PROJ or proj >= self.num_blocks:
            raise ValueError(f"no block of projection {proj}")
        return self.block_pages(proj, bits) * self.page_bytes

    def weight_pages_by_bits(self) -> dict[int, int]:
        """Pages the store holds per tag bits; equals the arena's weight accounting."""
        out: dict[int, int] = {}
        for b in range(self.num_blocks):
            held = len(self.resident_pages(b))
            if held:
                out[self.bits(b)] = out.get(self.bits(b), 0) + held
            pending = self._pending.get(b)
            if pending is not None:
                tgt = bits_for_fields(pending.fields)
                out[tgt] = out.get(tgt, 0) + len(self.pending_pages(b))
        return dict(sorted((k, v) for k, v in out.items() if v))

    # -- transitions -------------------------------------------------------------
    def promote(self, block: int, bits: int) -> int:
        """Starts copying the missing fields of ``block`` up to ``bits``; returns the bytes to copy.

        Raises OutOfPages (nothing changed) when the arena lacks the pages. An
        earlier in-flight promotion of the block is completed first.
        """
        target = fields_for_bits(bits)
        if target == 0:
            raise ValueError("promote needs a view bitwidth; use set_host_only to drop a block")
        self._finish(block)
        have = self._fields[block]
        if target < have:
            raise ValueError(f"block {block} is at {self.bits(block)} bits; promote to {bits} would lower it")
        if target == have:
            return 0
        allocated = self.arena.alloc(sum(self._num_pages[block][have:target]), PageTag("weight", bits))
        by_field: dict[int, list[int]] = {}
        copies: list[Copy] = []
        rest = allocated
        for f in range(have, target):
            n = self._num_pages[block][f]
            by_field[f], rest = rest[:n], rest[n:]
            copies.extend(self._copies_for(block, f, by_field[f]))
        nbytes = len(allocated) * self.page_bytes
        try:
            handle = self._copy.submit(copies)
        except BaseException:
            self.arena.free(allocated)  # nothing was committed: give the pages back
            raise
        self._pending[block] = _Pending(target, by_field, handle, nbytes)
        return nbytes

    def _copies_for(self, block: int, f: int, pages: list[int]) -> list[Copy]:
        """One copy per run of consecutive arena pages."""
        storage = self.arena.storage
        assert storage is not None
        src = self.masters.pages(block, f)
        copies: list[Copy] = []
        start = 0
        for i in range(1, len(pages) + 1):
            if i == len(pages) or pages[i] != pages[i - 1] + 1:
                copies.append((storage[pages[start] : pages[i - 1] + 1], src[start:i]))
                start = i
        return copies

    def demote(self, block: int, bits: int) -> int:
        """Drops the trailing fields of ``block`` down to ``bits`` (0 = host-only); returns bytes freed."""
        target = fields_for_bits(bits)
        self._finish(block)
        have = self._fields[block]
        if target > have:
            raise ValueError(f"block {block} is at {self.bits(block)} bits; demote to {bits} would raise it")
        if target == have:
            return 0
        freed = self._drop_fields(block, target)
        self.counters.demotions += 1
        self.counters.bytes_demoted += freed
        return freed

    def _drop_fields(self, block: int, target: int) -> int:
        """Frees the fields of ``block`` from ``target`` up (no counters); returns bytes freed."""
        have = self._fields[block]
        # Readers stop using the fields before they are freed. A slice (a fill
        # kernel, ordered after the step launched ahead), not ``t[i] = x``, a
        # host scalar's copy that waits for the queued step: ~20 ms per demoting
        # hook at Mixtral B=64 on the H100 against 1.9 ms (medians; results
        # memory_pressure_gap_h100_s41.json, ..._warmup_h100_s42.json; the wait
        # alone: table_write_sync_calibrated_h100_s43.json).
        self.block_fields[block : block + 1] = target
        self.page_table[block, target:have] = -1
        dropped = [p for f in range(target, have) for p in self._pages[block][f]]
        for f in range(target, have):
            self._pages[block][f] = []
        self._set_fields(block, target)
        self.arena.free(dropped)
        if target:
            self.arena.retag(self.resident_pages(block), PageTag("weight", bits_for_fields(target)))
        else:
            self._show_master(block)
        self._version[block] += 1
        return len(dropped) * self.page_bytes

    def set_host_only(self, block: int) -> int:
        """Frees every arena page of ``block``; it stays readable from the host."""
        return self.demote(block, HOST_ONLY_BITS)

    def poll(self) -> int:
        """Commits every promotion whose copy has landed; returns how many. Never blocks."""
        ready = [b for b, p in self._pending.items() if p.handle.done()]
        for b in ready:
            self._commit(b)
        return len(ready)

    def sync(self) -> None:
        """Waits for and commits every in-flight promotion."""
        for b in list(self._pending):
            self._finish(b)

    def _finish(self, block: int) -> None:
        pending = self._pending.get(block)
        if pending is not None:
            pending.handle.wait()
            self._commit(block)

    def _host_ints(self, values: list[int]) -> torch.Tensor:
        """int32 [len(values)] on the host, pinned for a CUDA store: a copy from
        pageable memory would wait for the stream (torch keeps a pinned
        source alive until its non-blocking copy has run)."""
        host = torch.tensor(values, dtype=torch.int32)
        return host.pin_memory() if self.page_table.is_cuda else host

    def _commit(self, block: int) -> None:
        pending = self._pending.pop(block)
        if self._fields[block] == HOST_ONLY_FIELDS:
            # Off the host: rows past the new view stop naming master pages
            # (never read: block_fields bounds the reads, but -1 is the contract).
            self.page_table[block, pending.fields :] = -1
        for f, pages in pending.pages.items():
            self.page_table[block, f, : len(pages)].copy_(self._host_ints(pages), non_blocking=True)
            self._pages[block][f] = pages
        old = self.resident_pages(block)
        self.block_fields[block : block + 1] = pending.fields  # written last: the commit point (a slice: see demote)
        self._set_fields(block, pending.fields)
        bits = bits_for_fields(pending.fields)
        if old:
            self.arena.retag(old, PageTag("weight", bits))
        self._version[block] += 1
        self.counters.bytes_promoted += pending.nbytes
        self.counters.promotions += 1

    # -- uses ------------------------------------------------------------------------
    def record_use(self, blocks: Iterable[int], host_only: Collection[int] | None = None) -> None:
        """One use of each of ``blocks`` (a step's routed blocks): recency for
        the controller's fallback walk, and the host-only ones counted as
        reads over the host link (``host_reads`` / ``host_read_bytes``).
        ``host_only``: the host-only blocks when the step was queued
        (``host_only_set`` then; default: now), as a transition committed
        since does not change what the step read."""
        blocks = list(blocks)
        self.recency.touch(blocks)
        on_host = self._host_only if host_only is None else host_only
        if on_host:  # called every step: with nothing on the host, no pass over the blocks
            read = [b for b in blocks if b in on_host]
            self.counters.host_reads += len(read)
            self.counters.host_read_bytes += sum(self.masters.master_bytes(b) for b in read)

    # -- readers ----------------------------------------------------------------------
    def read_view(self, block: int) -> BlockView:
        """The committed view of ``block`` read through the page table.

        A host-only block is read from the host copy at the master view
        (transient device copy; the arena is not touched).
        """
        n, k = self._shapes[block]
        fields = self._fields[block]
        if fields == HOST_ONLY_FIELDS:
            parsed = [field_from_bytes(self.field_bytes(block, f).to(self.device), n, k, f) for f in range(NUM_FIELDS)]
            return BlockView(VIEW_BITS[-1], tuple(c for c, _ in parsed), parsed[-1][1])
        storage = self.arena.storage
        assert storage is not None
        parsed = []
        for f in range(fields):
            idx = self.page_table[block, f, : self._num_pages[block][f]].long()  # [pages]
            parsed.append(field_from_bytes(storage.index_select(0, idx).reshape(-1), n, k, f))
        return BlockView(bits_for_fields(fields), tuple(c for c, _ in parsed), parsed[-1][1])

    def decode(self, block: int) -> tuple[int, torch.Tensor]:
        """(bits, float32 [N, K]) of ``block`` at its committed view."""
        view = self.read_view(block)
        n, k = self._shapes[block]
        return view.bits, decode_view(view.codes, view.scales, n, k)
