"""Property tests: random KV traffic and precision transitions on one arena.

Invariants after every step:
* a page never has two owners (resident weight pages, in-flight promotion
  pages and KV pages are disjoint and exactly the arena's allocated pages);
* the accounting balances (free + KV + weights by bits == total; weights by
  bits match the store's per-block bits; every page carries its owner's tag);
* a promotion is never visible before its copy lands (bits, block_fields and
  what readers decode stay at the old view; the copy engine poisons the
  destination pages so an early read would show);
* the budget (arena size) is never exceeded.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dataplane.memory.arena import KV_TAG, OutOfPages, PageTag
from dataplane.weights.codec import encode
from dataplane.weights.layout import NUM_FIELDS, VIEW_BITS, fields_for_bits
from dataplane.weights.store import WeightStore

from .support import HeldCopyEngine, arena_for, expected_view, random_block_matrix

PAGE = 256
NUM_PAGES = 200  # < the 8-bit footprint of all blocks (259 pages, rows padded to 64): real pressure
SHAPES = [(16, 128), (8, 256), (24, 128), (16, 128), (8, 128), (32, 128)]
BITS_OR_HOST = (0, *VIEW_BITS)


def _read_fields(bits: int) -> int:
    """block_fields of a block committed at ``bits``: a host-only block is
    read at the master view from its host pages."""
    return fields_for_bits(bits) if bits else NUM_FIELDS
KV_SCRIBBLE = 0x3C
BLOCKS = tuple(encode(random_block_matrix(n, k, seed=10 + i)) for i, (n, k) in enumerate(SHAPES))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.arena = arena_for(NUM_PAGES, PAGE)
        self.engine = HeldCopyEngine()
        self.store = WeightStore(self.arena, BLOCKS, initial_bits=[4, 2, 3, 0, 2, 2], copy_engine=self.engine)
        self.kv: list[list[int]] = []
        self.batch_of: dict[int, object] = {}  # block -> its in-flight batch

    # -- helpers ---------------------------------------------------------------------
    def _effective_bits(self, block: int) -> int:
        pending = self.store.pending_bits(block)
        return self.store.bits(block) if pending is None else pending

    def _state(self):
        return (
            self.arena.snapshot(),
            self.store.block_bits(),
            [self.store.pending_bits(b) for b in range(len(BLOCKS))],
            self.store.page_table.clone(),
            self.store.block_fields.clone(),
        )

    def _assert_unchanged(self, before) -> None:
        after = self._state()
        assert after[:3] == before[:3]
        assert torch.equal(after[3], before[3]) and torch.equal(after[4], before[4])

    # -- KV traffic ------------------------------------------------------------------
    @rule(n=st.integers(1, 12))
    def kv_alloc(self, n: int) -> None:
        before = self._state()
        try:
            pages = self.arena.alloc(n, KV_TAG)
        except OutOfPages:
            self._assert_unchanged(before)
            return
        for p in pages:  # a KV write: would corrupt any weight page it shared
            self.arena.page_view(p).fill_(KV_SCRIBBLE)
        self.kv.append(pages)

    @precondition(lambda self: self.kv)
    @rule(data=st.data())
    def kv_free(self, data) -> None:
        self.arena.free(self.kv.pop(data.draw(st.integers(0, len(self.kv) - 1))))

    # -- transitions -------------------------------------------------------------------
    @rule(block=st.integers(0, len(SHAPES) - 1), bits=st.sampled_from(BITS_OR_HOST))
    def demote(self, block: int, bits: int) -> None:
        current = self._effective_bits(block)
        if bits > current:
            with pytest.raises(ValueError):
                self.store.demote(block, bits)
            return
        self.store.demote(block, bits)
        assert self.store.bits(block) == bits and self.store.pending_bits(block) is None
        assert self.store.block_fields[block].item() == _read_fields(bits)

    @rule(block=st.integers(0, len(SHAPES) - 1), bits=st.sampled_from(VIEW_BITS))
    def promote(self, block: int, bits: int) -> None:
        current = self._effective_bits(block)
        if bits < current:
            with pytest.raises(ValueError):
                self.store.promote(block, bits)
            return
        before = self._state()
        try:
            self.store.promote(block, bits)
        except OutOfPages:
            # An earlier in-flight promotion of this block may have been completed
            # first; beyond that nothing changed.
            if before[2][block] is None:
                self._assert_unchanged(before)
            assert self.store.pending_bits(block) is None and self.store.bits(block) == current
            return
        assert self.store.bits(block) == current  # not visible yet
        if bits > current:
            assert self.store.pending_bits(block) == bits
            self.batch_of[block] = self.engine.batches[-1]

    @precondition(lambda self: self.engine.in_flight())
    @rule(data=st.data())
    def land_one(self, data) -> None:
        flying = self.engine.in_flight()
        batch = flying[data.draw(st.integers(0, len(flying) - 1))]
        bits_before = self.store.block_bits()
        batch.land()
        assert self.store.block_bits() == bits_before  # landed is not committed

    @rule()
    def poll(self) -> None:
        self.store.poll()
        for block in range(len(BLOCKS)):
            batch = self.batch_of.get(block)
            if batch is not None and batch.landed:
                assert self.store.pending_bits(block) is None

    @rule(blocks=st.lists(st.integers(0, len(SHAPES) - 1), max_size=4))
    def record_use(self, blocks: list[int]) -> None:
        free = self.arena.free_pages
        reads = self.store.counters.host_reads
        self.store.record_use(blocks)
        assert self.store.counters.host_reads == reads + sum(self.store.bits(b) == 0 for b in blocks)
        assert self.arena.free_pages == free  # reading from the host takes no pages

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def readers_see_committed_views(self) -> None:
        for b, blk in enumerate(BLOCKS):
            bits, w = self.store.decode(b)
            assert bits == (self.store.bits(b) or VIEW_BITS[-1])
            assert torch.equal(w, expected_view(blk, self.store.bits(b)))

    @invariant()
    def never_visible_before_landing(self) -> None:
        for b in range(len(BLOCKS)):
            pending = self.store.pending_bits(b)
            if pending is not None:
                assert self.store.bits(b) < pending
                assert self.store.block_fields[b].item() == _read_fields(self.store.bits(b))

    @invariant()
    def one_owner_per_page_and_tables_agree(self) -> None:
        owned: list[int] = [p for pages in self.kv for p in pages]
        for p in owned:
            assert self.arena.tag_of(p) == KV_TAG
        for b in range(len(BLOCKS)):
            fields = self.store.block_fields[b].item()
            assert fields == _read_fields(self.store.bits(b))
            table = self.store.page_table[b]
            in_arena = (table >= 0) & (table < NUM_PAGES)
            from_table = [p for f in range(fields) for p in table[f][in_arena[f]].tolist()]
            assert from_table == self.store.resident_pages(b)
            assert (table[fields:NUM_FIELDS] == -1).all()
            if self.store.bits(b) == 0:  # every row names master pages on the host
                assert not in_arena.any() and (table[:, 0] != -1).all()
            for p in from_table:
                assert self.arena.tag_of(p) == PageTag("weight", self.store.bits(b))
            pending = self.store.pending_bits(b)
            for p in self.store.pending_pages(b):
                assert self.arena.tag_of(p) == PageTag("weight", pending)
            owned += from_table + self.store.pending_pages(b)
        assert len(owned) == len(set(owned)), "a page has two owners"
        allocated = {p for p in range(NUM_PAGES) if self.arena.tag_of(p) is not None}
        assert set(owned) == allocated

    @invariant()
    def accounting_balances_within_budget(self) -> None:
        snap = self.arena.snapshot()
        assert snap.free_pages + snap.kv_pages + snap.weight_pages == snap.total_pages == NUM_PAGES
        assert snap.kv_pages == sum(len(p) for p in self.kv)
        assert snap.weight_pages_by_bits == self.store.weight_pages_by_bits()
        assert snap.free_pages >= 0


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
