"""Arena: cached free pages (the prefix cache's) count as free, are evicted
only when blank pages run out, oldest first, and can be revived intact."""

from __future__ import annotations

import pytest

from dataplane.memory.arena import KV_TAG, Arena, OutOfPages, PageTag

WEIGHTS_4 = PageTag("weight", 4)


def accounted(arena: Arena) -> int:
    snap = arena.snapshot()
    return snap.free_pages + snap.kv_pages + snap.weight_pages


def test_cached_pages_are_free_and_evicted_only_after_blank_ones_oldest_first():
    arena = Arena(6, 64, allocate_storage=False)
    evicted: list[list[int]] = []
    arena.set_eviction_listener(evicted.append)
    kv = arena.alloc(4, KV_TAG)
    arena.free(kv[:3], keep=True)  # cached in this order: kv[0] is the oldest
    assert arena.free_pages == 5 and arena.cached_pages == 3
    assert arena.snapshot().cached_pages == 3 and accounted(arena) == 6
    blank = arena.alloc(2, WEIGHTS_4)
    assert set(blank).isdisjoint(kv) and evicted == []  # the blank pages went first
    more = arena.alloc(2, WEIGHTS_4)
    assert more == kv[:2] and evicted == [kv[:2]] and arena.cached_pages == 1
    with pytest.raises(OutOfPages):
        arena.alloc(2, KV_TAG)
    assert arena.cached_pages == 1 and evicted == [kv[:2]]  # a refused allocation evicts nothing
    assert accounted(arena) == 6


def test_revive_takes_a_cached_page_back_and_only_a_cached_one():
    arena = Arena(3, 64)
    page = arena.alloc(1, KV_TAG)[0]
    arena.page_view(page).fill_(7)
    arena.free([page], keep=True)
    arena.revive(page, KV_TAG)
    assert arena.tag_of(page) == KV_TAG and arena.cached_pages == 0
    assert bool((arena.page_view(page) == 7).all())
    with pytest.raises(ValueError, match="not cached"):
        arena.revive(page, KV_TAG)
    arena.free([page])  # a blank free is not cached
    with pytest.raises(ValueError, match="not cached"):
        arena.revive(page, KV_TAG)


def test_only_kv_pages_can_be_kept():
    arena = Arena(2, 64, allocate_storage=False)
    pages = arena.alloc(1, WEIGHTS_4)
    with pytest.raises(ValueError, match="only KV pages"):
        arena.free(pages, keep=True)
    assert arena.tag_of(pages[0]) == WEIGHTS_4  # nothing changed
