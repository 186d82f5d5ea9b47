"""KV block manager: block tables per sequence over arena pages tagged KV.

One arena page holds one KV block for ALL layers: ``block_size`` tokens x
layers x (K, V) x kv_heads x head_dim. The arena storage is viewed as
``[pages, layers, 2, block_size, kv_heads, head_dim]`` (the first
``kv_block_bytes`` of each page, so a page may be larger than a block), and
layer ``l`` reads ``view[:, l, 0]`` / ``view[:, l, 1]``: strided
``[pages, block_size, kv_heads, head_dim]`` tensors indexed by page id.

Prefix cache: a full block whose K/V are computed is registered under its
content (the tokens it holds and the block before it), so a later sequence
whose tokens start the same way attaches those pages instead of computing
them again. Pages may be shared (reference counted); a registered page that
no sequence holds any more is freed into the arena as *cached*: it counts as
free, and the arena evicts it (least recently freed first) only when someone
needs the page. The cache therefore never costs a demotion or a preemption.
Only full blocks below a sequence's computed tokens are registered, and a
sequence only writes at positions past them, so a shared page is never
written. Matching is exact (the tokens themselves are the key, chained by an
id per registered block); a block evicted takes its id along, which makes
the blocks registered under it unreachable until they are evicted too.
K/V reused this way were computed at the expert precision of their time, as
a running sequence's own earlier K/V are.

Mechanism only: the manager allocates when asked and frees when told; the
scheduler decides who gets blocks, who is preempted and who may use the
cache. Not thread-safe (the engine thread owns it, as it owns the arena).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


# The parent id of a sequence's first block.
ROOT_BLOCK_ID = 0
# (parent block id, the block's token ids): exact, no hash collisions.
BlockKey = tuple[int, tuple[int, ...]]
# tokens(start, end): a sequence's token ids at positions start..end-1.
TokenSource = Callable[[int, int], list[int]]


@dataclass
class _CachedBlock:
    block_id: int
    page: int


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
        prefix_caching: bool = True,
    ) -> None:
        self.arena = arena
        self.prefix_caching = prefix_caching
        self.block_size = block_size
        self.num_layers = num_layers
        self.block_bytes = kv_block_bytes(block_size, num_layers, num_kv_heads, head_dim, dtype)
        if self.block_bytes > arena.page_bytes:
            raise ValueError(f"a KV block needs {self.block_bytes} bytes, arena pages have {arena.page_bytes}")
        self._tables: dict[str, list[int]] = {}
        self._used = 0  # distinct pages held by sequences
        self._refs: dict[int, int] = {}  # page -> sequences holding it
        # The prefix cache: content -> registered page, and back.
        self._blocks: dict[BlockKey, _CachedBlock] = {}
        self._key_of_page: dict[int, BlockKey] = {}
        self._next_block_id = ROOT_BLOCK_ID + 1
        # seq -> ids of its leading full blocks already matched or registered.
        self._chains: dict[str, list[int]] = {}
        arena.set_eviction_listener(self._forget)
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
        """Blocks that could be allocated now (every free arena page, cached ones included)."""
        return self.arena.free_pages

    @property
    def cached_blocks(self) -> int:
        """Registered blocks that no sequence holds (free, evictable)."""
        return self.arena.cached_pages

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
        for page in pages:
            self._refs[page] = 1
        self._tables.setdefault(seq_id, []).extend(pages)
        self._used += needed

    def attach_prefix(self, seq_id: str, tokens: list[int], max_blocks: int) -> int:
        """Gives a sequence that holds no blocks the cached pages of its
        longest registered prefix of full blocks, at most ``max_blocks``;
        returns the tokens they hold (their K/V need no computing)."""
        if seq_id in self._tables:
            raise ValueError(f"{seq_id} already holds blocks")
        if not self.prefix_caching:
            return 0
        size = self.block_size
        chain: list[int] = []
        pages: list[int] = []
        parent = ROOT_BLOCK_ID
        for block in range(min(max_blocks, len(tokens) // size)):
            cached = self._blocks.get((parent, tuple(tokens[block * size : (block + 1) * size])))
            if cached is None:
                break
            chain.append(cached.block_id)
            pages.append(cached.page)
            parent = cached.block_id
        if not pages:
            return 0
        for page in pages:
            if page in self._refs:
                self._refs[page] += 1
            else:
                self.arena.revive(page, KV_TAG)
                self._refs[page] = 1
                self._used += 1
        self._tables[seq_id] = pages
        self._chains[seq_id] = chain
        return len(pages) * size

    def commit(self, seq_id: str, num_computed_tokens: int, tokens: TokenSource) -> None:
        """Registers the sequence's full blocks below ``num_computed_tokens``
        (their K/V are written) in the prefix cache. A block whose content is
        registered already keeps the registered page; the sequence's own copy
        stays private and is freed as usual."""
        if not self.prefix_caching or seq_id not in self._tables:
            return
        size = self.block_size
        table = self._tables[seq_id]
        chain = self._chains.setdefault(seq_id, [])
        while (len(chain) + 1) * size <= num_computed_tokens:
            block = len(chain)
            key = (chain[-1] if chain else ROOT_BLOCK_ID, tuple(tokens(block * size, (block + 1) * size)))
            cached = self._blocks.get(key)
            if cached is None:
                cached = _CachedBlock(self._next_block_id, table[block])
                self._next_block_id += 1
                self._blocks[key] = cached
                self._key_of_page[cached.page] = key
            chain.append(cached.block_id)

    def free(self, seq_id: str) -> int:
        """Releases the sequence's blocks; the count it held. A page no other
        sequence holds goes back to the arena: cached when it is registered
        (the sequence's last blocks first in line for eviction), else blank."""
        pages = self._tables.pop(seq_id, [])
        self._chains.pop(seq_id, None)
        blank: list[int] = []
        kept: list[int] = []
        for page in reversed(pages):
            self._refs[page] -= 1
            if self._refs[page]:
                continue
            del self._refs[page]
            self._used -= 1
            (kept if page in self._key_of_page else blank).append(page)
        self.arena.free(blank)
        self.arena.free(kept, keep=True)
        return len(pages)

    def _forget(self, pages: list[int]) -> None:
        """The arena evicted these cached pages: their content is gone."""
        for page in pages:
            del self._blocks[self._key_of_page.pop(page)]
