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
