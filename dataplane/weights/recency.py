"""BlockRecency: a logical clock of expert-block accesses (least recently used first).

The forward (or the graph runner, from a step's routing counts) touches the
blocks it routes to; the precision controller's fallback walk, used while no
plan is present, demotes the least recently used blocks first and promotes
the most recently used first. Not thread-safe: the engine thread drives it.
"""

from __future__ import annotations

from collections.abc import Iterable


class BlockRecency:
    def __init__(self, num_blocks: int) -> None:
        self._last_access = [0] * num_blocks
        self.clock = 0  # ticks once per touch

    def touch(self, blocks: Iterable[int]) -> None:
        """Records an access (one tick of the logical clock) to ``blocks``."""
        self.clock += 1
        for b in blocks:
            self._last_access[b] = self.clock

    def last_access(self, block: int) -> int:
        """Logical time of the last access (0 = never)."""
        return self._last_access[block]

    def lru_order(self, blocks: Iterable[int]) -> list[int]:
        """``blocks`` ordered least recently used first (ties by block index)."""
        return sorted(blocks, key=lambda b: (self._last_access[b], b))
