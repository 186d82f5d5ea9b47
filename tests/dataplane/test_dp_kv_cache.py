"""KV block manager: arena views, all-or-nothing growth, frees."""

from __future__ import annotations

import pytest
import torch

from dataplane.kv_cache import KVCacheManager, kv_block_bytes
from dataplane.layers.attention import write_kv
from dataplane.memory.arena import Arena, OutOfPages

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 3, 2, 4, 4


def make(num_pages: int, extra_page_bytes: int = 0) -> KVCacheManager:
    page = kv_block_bytes(BLOCK, LAYERS, KV_HEADS, HEAD_DIM, torch.float32) + extra_page_bytes
    arena = Arena(num_pages, page)
    arena.storage.zero_()
    return KVCacheManager(arena, BLOCK, LAYERS, KV_HEADS, HEAD_DIM, torch.float32)


@pytest.mark.parametrize("extra", [0, 64])
def test_layer_views_alias_the_arena_pages(extra):
    kv = make(5, extra)
    kv.allocate("s", 6)  # two blocks
    page = kv.block_table("s")[1]
    k_cache, v_cache = kv.layer_caches[2]
    assert k_cache.shape == (5, BLOCK, KV_HEADS, HEAD_DIM)
    slot = kv.slot("s", 5)  # block 1, offset 1
    k = torch.full((1, KV_HEADS, HEAD_DIM), 3.0)
    v = torch.full((1, KV_HEADS, HEAD_DIM), 5.0)
    write_kv(k, v, k_cache, v_cache, torch.tensor([slot]))
    raw = kv.arena.storage.view(torch.float32) if extra == 0 else None
    words = kv.arena.page_view(page).view(torch.float32)  # the page as floats
    # [layers, 2, block, kv_heads, head_dim] row-major inside the page
    layout = words[: LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM].view(LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM)
    assert torch.all(layout[2, 0, 1] == 3.0) and torch.all(layout[2, 1, 1] == 5.0)
    assert layout.count_nonzero() == 2 * KV_HEADS * HEAD_DIM  # nothing else written
    others = [p for p in range(5) if p != page]
    assert all(kv.arena.page_view(p).count_nonzero() == 0 for p in others)
    if raw is not None:
        assert raw.count_nonzero() == 2 * KV_HEADS * HEAD_DIM


def test_growth_is_all_or_nothing_and_free_returns_pages():
    kv = make(3)
    kv.allocate("a", 5)
    assert kv.used_blocks == 2 and kv.free_blocks == 1
    kv.allocate("a", 8)  # still two blocks
    assert kv.num_blocks("a") == 2
    assert kv.blocks_needed("b", 9) == 3
    with pytest.raises(OutOfPages):
        kv.allocate("b", 9)
    assert kv.num_blocks("b") == 0 and kv.free_blocks == 1  # nothing taken
    kv.allocate("b", 4)
    assert kv.free("a") == 2 and kv.used_blocks == 1 and kv.free_blocks == 2
    assert kv.free("a") == 0  # idempotent for unknown sequences
    assert kv.arena.snapshot().kv_pages == 1


def test_block_larger_than_page_is_refused():
    page = kv_block_bytes(BLOCK, LAYERS, KV_HEADS, HEAD_DIM, torch.float32)
    with pytest.raises(ValueError, match="arena pages"):
        KVCacheManager(Arena(2, page), BLOCK, LAYERS + 1, KV_HEADS, HEAD_DIM, torch.float32)


# -- the prefix cache --------------------------------------------------------------
PROMPT = list(range(100, 111))  # 11 tokens: blocks [0:4] [4:8], a partial [8:11]


def tokens_of(ids: list[int]):
    return lambda start, end: ids[start:end]


def computed(kv: KVCacheManager, seq_id: str, ids: list[int]) -> None:
    """``seq_id`` holds and has computed the K/V of ``ids``."""
    kv.allocate(seq_id, len(ids))
    kv.commit(seq_id, len(ids), tokens_of(ids))


def test_a_finished_prefix_is_cached_in_free_pages_and_attached_again():
    kv = make(6)
    computed(kv, "a", PROMPT)
    first_two = kv.block_table("a")[:2]
    assert kv.free("a") == 3
    # The two full blocks stay cached; they count as free.
    assert kv.used_blocks == 0 and kv.cached_blocks == 2 and kv.free_blocks == 6
    assert kv.arena.snapshot().cached_pages == 2 and kv.arena.snapshot().kv_pages == 0
    assert kv.attach_prefix("b", PROMPT + [7], max_blocks=10) == 2 * BLOCK
    assert kv.block_table("b") == first_two and kv.used_blocks == 2 and kv.cached_blocks == 0
    kv.allocate("b", len(PROMPT) + 1)  # the rest comes from blank pages
    assert kv.block_table("b")[:2] == first_two and kv.num_blocks("b") == 3


def test_attach_matches_whole_blocks_from_the_first_and_respects_max_blocks():
    kv = make(8)
    computed(kv, "a", PROMPT)
    kv.free("a")
    assert kv.attach_prefix("b", PROMPT[:7], max_blocks=10) == BLOCK  # [4:8] is not full in b
    assert kv.attach_prefix("c", PROMPT, max_blocks=1) == BLOCK
    assert kv.attach_prefix("d", [0] + PROMPT[1:], max_blocks=10) == 0  # first block differs
    # The second block's tokens alone do not match: the key includes the block before.
    assert kv.attach_prefix("e", PROMPT[4:8] + PROMPT[4:8], max_blocks=10) == 0
    with pytest.raises(ValueError, match="already holds"):
        kv.attach_prefix("b", PROMPT, max_blocks=10)


def test_shared_pages_are_counted_once_and_freed_with_their_last_holder():
    kv = make(6)
    computed(kv, "a", PROMPT)
    assert kv.attach_prefix("b", PROMPT, max_blocks=2) == 2 * BLOCK
    assert kv.used_blocks == 3  # a's three, two of them shared with b
    kv.free("a")
    assert kv.used_blocks == 2 and kv.cached_blocks == 0  # b still holds the shared two
    kv.free("b")
    assert kv.used_blocks == 0 and kv.cached_blocks == 2


def test_allocation_evicts_cached_pages_last_block_first_and_forgets_them():
    kv = make(3)
    computed(kv, "a", PROMPT[:8])  # two full blocks, both registered
    kv.free("a")
    assert kv.cached_blocks == 2 and kv.free_blocks == 3
    kv.allocate("x", 2 * BLOCK)  # one blank page, then the oldest cached: a's second block
    assert kv.cached_blocks == 1
    assert kv.attach_prefix("b", PROMPT, max_blocks=10) == BLOCK  # only the first block is left
    kv.free("b")
    kv.free("x")
    kv.allocate("y", 3 * BLOCK)  # everything: the cache is gone
    assert kv.cached_blocks == 0 and kv.attach_prefix("c", PROMPT, max_blocks=10) == 0


def test_identical_content_keeps_the_first_page_and_the_copy_is_freed_blank():
    kv = make(6)
    computed(kv, "a", PROMPT[:4])
    computed(kv, "b", PROMPT[:4])  # computed alongside, not attached
    kv.free("a")
    kv.free("b")
    assert kv.cached_blocks == 1 and kv.free_blocks == 6


def test_only_computed_full_blocks_are_registered():
    kv = make(6)
    kv.allocate("a", len(PROMPT))
    kv.commit("a", 5, tokens_of(PROMPT))  # block 0 computed, block 1 not yet
    kv.free("a")
    assert kv.cached_blocks == 1
    assert kv.attach_prefix("b", PROMPT, max_blocks=10) == BLOCK


def test_cached_content_survives_in_the_page():
    kv = make(4)
    kv.allocate("a", BLOCK)
    page = kv.block_table("a")[0]
    kv.arena.page_view(page).fill_(9)
    kv.commit("a", BLOCK, tokens_of(PROMPT))
    kv.free("a")
    kv.allocate("other", 2 * BLOCK)  # blank pages first: the cached one is untouched
    assert kv.attach_prefix("b", PROMPT, max_blocks=1) == BLOCK
    assert kv.block_table("b") == [page] and bool((kv.arena.page_view(page) == 9).all())


def test_prefix_caching_off_attaches_and_keeps_nothing():
    page = kv_block_bytes(BLOCK, LAYERS, KV_HEADS, HEAD_DIM, torch.float32)
    kv = KVCacheManager(Arena(4, page), BLOCK, LAYERS, KV_HEADS, HEAD_DIM, torch.float32, prefix_caching=False)
    computed(kv, "a", PROMPT)
    kv.free("a")
    assert kv.cached_blocks == 0 and kv.attach_prefix("b", PROMPT, max_blocks=10) == 0
