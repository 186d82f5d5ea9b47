"""WeightStore: placement, transitions, accounting, host-only blocks."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from dataplane.memory.arena import KV_TAG, Arena, OutOfPages, PageTag
from dataplane.weights.codec import decode, encode
from dataplane.weights.layout import NUM_FIELDS, field_size, pages_for
from dataplane.weights.store import WeightStore

from .support import HeldCopyEngine, arena_for, expected_view, random_block_matrix

PAGE = 256
SHAPES = [(16, 128), (8, 256), (24, 128)]  # gate-, up-, down-like blocks of one expert


@pytest.fixture(scope="module")
def blocks():
    return [encode(random_block_matrix(n, k, seed=i)) for i, (n, k) in enumerate(SHAPES)]


def _pages_at(n: int, k: int, bits_fields: int) -> int:
    return sum(pages_for(field_size(n, k, f).total, PAGE) for f in range(bits_fields))


def test_initial_placement_and_page_contents(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=[8, 4, 2])
    snap = arena.snapshot()
    expected = {8: _pages_at(16, 128, 5), 4: _pages_at(8, 256, 3), 2: _pages_at(24, 128, 1)}
    assert snap.weight_pages_by_bits == expected == store.weight_pages_by_bits()
    assert store.block_bits() == [8, 4, 2]
    assert store.block_fields.tolist() == [5, 3, 1]
    assert store.counters.promotions == 0  # loading is not a transition
    for b, blk in enumerate(blocks):
        for f in range(NUM_FIELDS):
            assert torch.equal(store.field_bytes(b, f), blk.field_bytes(f))
        for f in range(store.block_fields[b].item()):
            row = store.page_table[b, f]
            pages = row[row >= 0].long()
            raw = arena.storage[pages].reshape(-1)
            assert torch.equal(raw[: blk.field_bytes(f).numel()], blk.field_bytes(f))
        assert (store.page_table[b, store.block_fields[b].item() :] == -1).all()
        assert torch.equal(store.decode(b)[1], decode(blk, store.bits(b)))


def test_initial_placement_that_does_not_fit_changes_nothing(blocks) -> None:
    arena = arena_for(10, PAGE)
    with pytest.raises(OutOfPages):
        WeightStore(arena, blocks, initial_bits=8)
    assert arena.free_pages == 10


def test_demote_frees_at_once_and_retags(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=8)
    free_before = arena.free_pages
    freed = store.demote(0, 3)
    assert freed == (_pages_at(16, 128, 5) - _pages_at(16, 128, 2)) * PAGE
    assert arena.free_pages == free_before + freed // PAGE
    assert store.bits(0) == 3 and store.block_fields[0].item() == 2
    assert (store.page_table[0, 2:] == -1).all()
    assert all(arena.tag_of(p) == PageTag("weight", 3) for p in store.resident_pages(0))
    assert store.counters.demotions == 1 and store.counters.bytes_demoted == freed
    assert torch.equal(store.decode(0)[1], decode(blocks[0], 3))
    assert store.demote(0, 3) == 0  # already there
    with pytest.raises(ValueError, match="would raise it"):
        store.demote(0, 6)


def test_promotion_commits_only_through_poll(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=2)
    version = store.version(1)
    nbytes = store.promote(1, 6)
    assert nbytes == (_pages_at(8, 256, 4) - _pages_at(8, 256, 1)) * PAGE
    # The CPU engine copied already, but nothing is visible before the commit.
    assert store.bits(1) == 2 and store.block_fields[1].item() == 1 and store.pending_bits(1) == 6
    assert store.version(1) == version
    assert store.poll() == 1
    assert store.bits(1) == 6 and store.block_fields[1].item() == 4 and store.pending_bits(1) is None
    assert store.version(1) == version + 1
    assert all(arena.tag_of(p) == PageTag("weight", 6) for p in store.resident_pages(1))
    assert store.counters.promotions == 1 and store.counters.bytes_promoted == nbytes
    assert torch.equal(store.decode(1)[1], decode(blocks[1], 6))
    with pytest.raises(ValueError, match="would lower it"):
        store.promote(1, 4)


def test_promotion_waits_for_held_copy(blocks) -> None:
    arena = arena_for(200, PAGE)
    engine = HeldCopyEngine()
    store = WeightStore(arena, blocks, initial_bits=3, copy_engine=engine)
    store.promote(2, 8)
    assert store.poll() == 0 and store.bits(2) == 3
    assert torch.equal(store.decode(2)[1], decode(blocks[2], 3))  # poisoned pages never read
    engine.land_all()
    assert store.bits(2) == 3  # landed, not yet committed
    assert store.poll() == 1 and store.bits(2) == 8
    assert torch.equal(store.decode(2)[1], decode(blocks[2], 8))


def test_demote_during_promotion_finishes_it_first(blocks) -> None:
    arena = arena_for(200, PAGE)
    engine = HeldCopyEngine()
    store = WeightStore(arena, blocks, initial_bits=2, copy_engine=engine)
    store.promote(0, 8)
    store.demote(0, 4)
    assert engine.in_flight() == []  # the copy was waited for, never freed under it
    assert store.bits(0) == 4 and store.pending_bits(0) is None
    assert store.counters.promotions == 1 and store.counters.demotions == 1
    assert store.weight_pages_by_bits() == arena.snapshot().weight_pages_by_bits


def test_out_of_pages_promotion_changes_nothing(blocks) -> None:
    need8 = _pages_at(16, 128, 5) + _pages_at(8, 256, 5) + _pages_at(24, 128, 5)
    arena = arena_for(need8 - 1, PAGE)
    store = WeightStore(arena, blocks, initial_bits=2)
    arena.alloc(arena.free_pages - 2, KV_TAG)
    before = (arena.snapshot(), store.block_bits(), store.page_table.clone(), store.block_fields.clone())
    with pytest.raises(OutOfPages):
        store.promote(0, 8)
    assert (arena.snapshot(), store.block_bits()) == before[:2]
    assert torch.equal(store.page_table, before[2]) and torch.equal(store.block_fields, before[3])
    assert store.pending_bits(0) is None and store.counters.promotions == 0


def _bytes_at(address: int, n: int) -> torch.Tensor:
    """uint8 [n]: host memory at a raw address (what a kernel following the
    page table there reads)."""
    return torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address)).copy())


def test_host_only_block_names_its_master_pages_on_the_host(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=4)
    free_before = arena.free_pages
    freed = store.set_host_only(1)
    assert store.bits(1) == 0 and len(store.host_only_set()) == 1 and store.block_fields[1].item() == NUM_FIELDS
    assert arena.free_pages == free_before + freed // PAGE and store.resident_pages(1) == []
    base = arena.storage.data_ptr()
    n, k = SHAPES[1]
    for f in range(NUM_FIELDS):
        row = store.page_table[1, f]
        used = pages_for(field_size(n, k, f).total, PAGE)
        entries = row[:used].tolist()
        assert all(e < 0 or e >= arena.num_pages for e in entries)  # never an arena page
        assert entries == list(range(entries[0], entries[0] + used)) and (row[used:] == -1).all()
        got = torch.cat([_bytes_at(base + e * PAGE, PAGE) for e in entries])[: field_size(n, k, f).total]
        assert torch.equal(got, store.field_bytes(1, f))  # the master's bytes, where the table says
    assert torch.equal(store.decode(1)[1], expected_view(blocks[1], 8))  # the master, from the host


def test_promoting_a_host_only_block_drops_its_host_rows(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=[8, 0, 2])
    assert len(store.host_only_set()) == 1 and store.block_fields.tolist() == [5, 5, 1]
    store.promote(1, 3)
    assert store.block_fields[1].item() == NUM_FIELDS  # readers see the master until the commit
    store.sync()
    assert len(store.host_only_set()) == 0 and store.block_fields[1].item() == 2
    assert all(0 <= p < arena.num_pages for p in store.resident_pages(1))
    assert (store.page_table[1, 2:] == -1).all()
    assert torch.equal(store.decode(1)[1], expected_view(blocks[1], 3))
    store.demote(0, 2)
    store.set_host_only(0)
    assert len(store.host_only_set()) == 1 and store.block_fields[0].item() == NUM_FIELDS
    assert store.counters.promotions == 1 and store.counters.demotions == 2


def test_record_use_counts_reads_of_host_only_blocks(blocks) -> None:
    store = WeightStore(arena_for(200, PAGE), blocks, initial_bits=[8, 0, 0])
    store.record_use([0, 1, 2])
    store.record_use([1])
    n1, k1 = SHAPES[1]
    n2, k2 = SHAPES[2]
    master = [sum(field_size(n, k, f).code_bytes for f in range(NUM_FIELDS))
              + field_size(n, k, NUM_FIELDS - 1).scale_bytes for n, k in ((n1, k1), (n2, k2))]
    assert store.counters.host_reads == 3
    assert store.counters.host_read_bytes == 2 * master[0] + master[1]
    assert master == [store.masters.master_bytes(1), store.masters.master_bytes(2)]
    assert store.recency.last_access(1) == 2 and store.recency.last_access(0) == 1
    queued = store.host_only_set()  # taken as a step is queued
    assert queued == {1, 2}
    store.promote(1, 2)
    store.sync()  # committed before the step's use is recorded: the step still read the host
    store.record_use([1], queued)
    store.record_use([1])  # a later step reads it from the arena
    assert store.counters.host_reads == 4 and store.host_only_set() == {2}


def test_footprint_and_recency(blocks) -> None:
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=8)
    for proj, (n, k) in enumerate(SHAPES):
        assert store.footprint_bytes(proj, 0) == 0
        for fields, bits in enumerate((2, 3, 4, 6, 8), start=1):
            assert store.footprint_bytes(proj, bits) == _pages_at(n, k, fields) * PAGE
    with pytest.raises(ValueError):
        store.footprint_bytes(3, 8)
    assert store.recency.last_access(0) == 0
    store.recency.touch([2])
    store.recency.touch([0, 1])
    assert store.recency.last_access(2) == 1 and store.recency.last_access(0) == 2
    assert store.recency.lru_order([0, 1, 2]) == [2, 0, 1]


def test_store_rejects_bad_construction(blocks) -> None:
    with pytest.raises(ValueError, match="storage"):
        WeightStore(Arena(100, PAGE, allocate_storage=False), blocks)
    with pytest.raises(ValueError, match="at least one block"):
        WeightStore(arena_for(100, PAGE), [])
    with pytest.raises(ValueError, match="unsupported bitwidth 5"):
        WeightStore(arena_for(100, PAGE), blocks, initial_bits=5)
    with pytest.raises(ValueError, match="entries for 3 blocks"):
        WeightStore(arena_for(100, PAGE), blocks, initial_bits=[8, 8])


class _NoElementWrites(torch.Tensor):
    """A device table that refuses ``t[i] = x`` / ``t[i, j] = x`` (integer
    indices only): on a CUDA tensor torch makes that a copy that waits for the
    stream. Slices (asynchronous fills) pass."""

    def __setitem__(self, index, value) -> None:
        parts = index if isinstance(index, tuple) else (index,)
        if all(isinstance(part, int) for part in parts):
            raise AssertionError(f"element write {index!r} to a device table")
        super().__setitem__(index, value)


def test_transitions_write_the_device_tables_by_slices(blocks) -> None:
    """The CPU guard of the rule the GPU test below checks on the device."""
    arena = arena_for(200, PAGE)
    store = WeightStore(arena, blocks, initial_bits=8)
    store.block_fields = store.block_fields.as_subclass(_NoElementWrites)
    store.page_table = store.page_table.as_subclass(_NoElementWrites)
    store.demote(0, 3)
    store.promote(0, 6)
    store.sync()
    assert store.block_bits()[0] == 6 and store.block_fields[0].item() == 4
    assert torch.equal(store.decode(0)[1], decode(blocks[0], 6))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_transitions_on_cuda_never_wait_for_the_stream(blocks) -> None:
    """A demotion and a promotion's commit are taken between decode steps while
    the step launched ahead still runs: none of their table writes may block
    the host on the stream (torch raises in sync-debug mode "error")."""
    arena = Arena(200, PAGE, device=torch.device("cuda"))
    store = WeightStore(arena, blocks, initial_bits=8)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        store.demote(0, 3)
        store.demote(1, 4)
        store.promote(0, 6)
        while store.pending_bits(0) is not None:
            store.poll()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert store.block_fields.tolist()[:2] == [4, 3] and store.block_bits()[:2] == [6, 4]
    for b in (0, 1):
        fields = store.block_fields[b].item()
        assert (store.page_table[b, fields:] == -1).all()
        assert torch.equal(store.decode(b)[1], decode(blocks[b], store.bits(b)).to(store.decode(b)[1].device))
