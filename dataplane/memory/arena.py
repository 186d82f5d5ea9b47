"""Arena: one pool of fixed-size pages for KV blocks and expert-weight pages.

Mechanism only: the arena hands out and takes back pages and keeps exact
accounting of who holds them; it never decides what to evict or demote.

Contract:
* every page has exactly one tag at a time: free, KV, or weights-at-b-bits;
* a free page may be *cached*: freed with ``keep=True``, it still holds the
  KV block its last owner wrote (the prefix cache, dataplane/kv_cache.py).
  A cached page counts as free for everyone: ``alloc`` hands out blank pages
  first, then evicts cached ones, least recently freed first, telling the
  eviction listener which; ``revive`` takes a cached page back as allocated.
  So the cache only ever occupies memory nobody else asks for;
* ``alloc`` is all-or-nothing: it either returns ``n`` distinct free pages or
  raises ``OutOfPages`` and changes nothing;
* ``free`` and ``retag`` only accept pages that are currently allocated, and
  ``free`` of a page that is already free is an error (no double free);
* the counts in ``snapshot()`` always add up to ``total_pages``.

The backing storage is one flat ``uint8`` tensor ``[num_pages, page_bytes]``
on the arena's device; callers view pages with the dtype and shape they need
(the KV cache as ``[pages, layers, 2, block_size, kv_heads, head_dim]``,
the weight store as packed ``int32`` words).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Called with the cached pages an allocation evicts (their content is lost).
EvictionListener = Callable[[list[int]], None]


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


@dataclass(frozen=True)
class PageTag:
    """Who holds a page: the KV cache, or weights of a block at ``bits``."""

    kind: str  # "kv" or "weight"
    bits: int = 0  # bitwidth of the owning block, weights only

    def __post_init__(self) -> None:
        if self.kind not in ("kv", "weight"):
            raise ValueError(f"unknown page kind {self.kind!r}")
        if self.kind == "weight" and not 1 <= self.bits <= 16:
            raise ValueError(f"weight pages need bits in 1..16, got {self.bits}")


KV_TAG = PageTag("kv")


@dataclass(frozen=True)
class ArenaSnapshot:
    """Exact page accounting at one moment."""

    page_bytes: int
    total_pages: int
    free_pages: int
    kv_pages: int
    weight_pages_by_bits: dict[int, int] = field(default_factory=dict)
    # Of free_pages, those still holding a cached KV block.
    cached_pages: int = 0

    @property
    def weight_pages(self) -> int:
        return sum(self.weight_pages_by_bits.values())


class Arena:
    """A fixed pool of ``num_pages`` pages of ``page_bytes`` bytes each."""

    def __init__(
        self,
        num_pages: int,
        page_bytes: int,
        device: torch.device | str = "cpu",
        allocate_storage: bool = True,
    ) -> None:
        if num_pages <= 0 or page_bytes <= 0:
            raise ValueError(f"arena needs positive sizes, got {num_pages} x {page_bytes}")
        if page_bytes % 16:
            raise ValueError(f"page_bytes must be a multiple of 16, got {page_bytes}")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.device = torch.device(device)
        # [num_pages, page_bytes]; absent in accounting-only arenas (tests, planning).
        self.storage: torch.Tensor | None = (
            torch.empty(num_pages, page_bytes, dtype=torch.uint8, device=self.device)
            if allocate_storage
            else None
        )
        # Free pages as a stack: low page ids are handed out first, which keeps
        # allocations deterministic for tests.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        # Free pages that still hold a KV block, least recently freed first.
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._tags: dict[int, PageTag] = {}
        self._count_by_tag: dict[PageTag, int] = {}
        self._eviction_listener: EvictionListener | None = None

    # -- allocation -----------------------------------------------------------
    @property
    def free_pages(self) -> int:
        """Pages any caller may allocate now (blank and cached)."""
        return len(self._free) + len(self._cached)

    @property
    def cached_pages(self) -> int:
        """Free pages still holding a cached KV block."""
        return len(self._cached)

    def set_eviction_listener(self, listener: EvictionListener) -> None:
        """The owner of the cached pages' content (one: the KV cache)."""
        self._eviction_listener = listener

    def alloc(self, n: int, tag: PageTag) -> list[int]:
        """Takes ``n`` free pages for ``tag``; all or nothing. Blank pages go
        first; cached ones are evicted (oldest first) only when those run out."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self.free_pages:
            raise OutOfPages(f"asked for {n} pages, {self.free_pages} free")
        blank = min(n, len(self._free))
        pages = [self._free.pop() for _ in range(blank)]
        evicted = [self._cached.popitem(last=False)[0] for _ in range(n - blank)]
        if evicted and self._eviction_listener is not None:
            self._eviction_listener(evicted)
        pages += evicted
        for page in pages:
            self._tags[page] = tag
        self._count_by_tag[tag] = self._count_by_tag.get(tag, 0) + n
        return pages

    def free(self, pages: list[int], keep: bool = False) -> None:
        """Returns allocated pages to the pool. ``keep``: KV pages whose
        content stays (cached, evictable), in the order given: the first is
        evicted first."""
        self._check_allocated(pages)
        if keep and any(self._tags[page] != KV_TAG for page in pages):
            raise ValueError("only KV pages can be kept cached")
        for page in pages:
            tag = self._tags.pop(page)
            self._count_by_tag[tag] -= 1
            if keep:
                self._cached[page] = None
            else:
                self._free.append(page)

    def revive(self, page: int, tag: PageTag) -> None:
        """Allocates the cached ``page`` again, its content intact."""
        if page not in self._cached:
            raise ValueError(f"page {page} is not cached")
        del self._cached[page]
        self._tags[page] = tag
        self._count_by_tag[tag] = self._count_by_tag.get(tag, 0) + 1

    def retag(self, pages: list[int], tag: PageTag) -> None:
        """Moves allocated pages to another tag (a block changed bitwidth)."""
        self._check_allocated(pages)
        for page in pages:
            old = self._tags[page]
            self._count_by_tag[old] -= 1
            self._tags[page] = tag
            self._count_by_tag[tag] = self._count_by_tag.get(tag, 0) + 1

    def tag_of(self, page: int) -> PageTag | None:
        """The page's tag, or None when it is free."""
        return self._tags.get(page)

    def _check_allocated(self, pages: list[int]) -> None:
        if len(set(pages)) != len(pages):
            raise ValueError("page list has duplicates")
        for page in pages:
            if page not in self._tags:
                raise ValueError(f"page {page} is not allocated")

    # -- accounting -----------------------------------------------------------
    def snapshot(self) -> ArenaSnapshot:
        by_bits: dict[int, int] = {}
        kv = 0
        for tag, count in self._count_by_tag.items():
            if count == 0:
                continue
            if tag.kind == "kv":
                kv += count
            else:
                by_bits[tag.bits] = by_bits.get(tag.bits, 0) + count
        return ArenaSnapshot(
            page_bytes=self.page_bytes,
            total_pages=self.num_pages,
            free_pages=self.free_pages,
            kv_pages=kv,
            weight_pages_by_bits=dict(sorted(by_bits.items())),
            cached_pages=len(self._cached),
        )

    # -- views ------------------------------------------------------------------
    def page_view(self, page: int) -> torch.Tensor:
        """The raw bytes of one page: ``[page_bytes]`` uint8."""
        if self.storage is None:
            raise RuntimeError("this arena has no storage (accounting only)")
        return self.storage[page]
