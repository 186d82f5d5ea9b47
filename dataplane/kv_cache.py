"""KV block manager: block tables per sequence over arena pages tagged KV.

One arena page holds one KV block for ALL layers: ``block_size`` tokens x
layers x (K, V) x kv_heads x head_dim. The arena storage is viewed as
``[pages, layers, 2, block_size, kv_heads, head_dim]`` (the first
``kv_block_bytes`` of each page, so a page may be larger than a block), and
layer ``l`` reads ``view[:, l, 0]`` / ``view[:, l, 1]``: strided
``[pages, block_size, kv_heads, head_dim]`` tensors indexed by page id.

Mechanism only: the manager allocates when asked and frees when told; the
scheduler decides who gets blocks and who is preempted. Not thread-safe (the
engine thread owns it, as it owns the arena).
"""

from __future__ import annotations

import torch

from dataplane.memory.arena import KV_TAG, Arena

KV_PARTS = 2  # K and V


def kv_block_bytes(
    block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of one KV block across all layers (= the arena page size)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return block_size * num_layers * KV_PARTS * num_kv_heads * head_dim * elem


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Owns the mapping sequence -> list of arena pages holding its K/V."""

    def __init__(
        self,
        arena: Arena,
        block_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self.arena = arena
        self.block_size = block_size
        self.num_layers = num_layers
        self.block_bytes = kv_block_bytes(block_size, num_layers, num_kv_heads, head_dim, dtype)
        if self.block_bytes > arena.page_bytes:
            raise ValueError(f"a KV block needs {self.block_bytes} bytes, arena pages have {arena.page_bytes}")
        self._tables: dict[str, list[int]] = {}
        self._used = 0
        # Per layer (k_cache, v_cache), each [pages, block_size, kv_heads, head_dim]; empty
        # for accounting-only arenas (scheduler tests).
        self.layer_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        # All layers: [pages, layers, 2, block_size, kv_heads, head_dim] (None without storage).
        self.cache_view: torch.Tensor | None = None
        if arena.storage is not None:
            elem = torch.empty((), dtype=dtype).element_size()
            if arena.page_bytes % elem:
                raise ValueError(f"page_bytes {arena.page_bytes} is not a multiple of {elem}")
            # [pages, page_bytes] -> [pages, block_bytes] -> [pages, layers, 2, bs, kvh, hd]
            typed = arena.storage[:, : self.block_bytes].view(dtype)
            view = typed.view(arena.num_pages, num_layers, KV_PARTS, block_size, num_kv_heads, head_dim)
            self.cache_view = view
            self.layer_caches = [(view[:, layer, 0], view[:, layer, 1]) for layer in range(num_layers)]

    # -- queries -------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """KV blocks held by sequences."""
        return self._used

    @property
    def free_blocks(self) -> int:
        """Blocks that could be allocated now (every free arena page)."""
        return self.arena.free_pages

    def block_table(self, seq_id: str) -> list[int]:
        """The sequence's pages in token order (empty when it holds none)."""
        return self._tables.get(seq_id, [])

    def num_blocks(self, seq_id: str) -> int:
        return len(self._tables.get(seq_id, ()))

    def blocks_needed(self, seq_id: str, num_tokens: int) -> int:
        """Extra blocks the sequence needs so its cache holds ``num_tokens``."""
        return max(0, blocks_for_tokens(num_tokens, self.block_size) - self.num_blocks(seq_id))

    def slot(self, seq_id: str, position: int) -> int:
        """Flat slot (page * block_size + offset) of the token at ``position``."""
        table = self._tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    # -- mutation ------------------------------------------------------------
    def allocate(self, seq_id: str, num_tokens: int) -> None:
        """Grows the sequence's table to hold ``num_tokens``; all or nothing.

        Raises ``OutOfPages`` (and changes nothing) when the arena is short.
        """
        needed = self.blocks_needed(seq_id, num_tokens)
        if needed == 0:
            return
        pages = self.arena.alloc(needed, KV_TAG)
        self._tables.setdefault(seq_id, []).extend(pages)
        self._used += needed

    def free(self, seq_id: str) -> int:
        """Returns all the sequence's blocks to the arena; the count freed."""
        pages = self._tables.pop(seq_id, [])
        if pages:
            self.arena.free(pages)
            self._used -= len(pages)
        return len(pages)
