"""RungWalker: the first applicable rung of a ladder, without rescanning it.

The controller asks, again and again, for "the first rung in ladder order
whose block is at the rung's from_bits, has no promotion in flight, is not
below its floor afterwards, and (unless overridden) has kept its bits for the
residence time". Rescanning the list from the top for every step is
quadratic for large plans (a Mixtral-sized ladder has ~74k rungs). This
walker answers the same question in amortized O(1) per rung:

* a cursor runs once over the list. A rung it passes is either *dead* (its
  block is not at from_bits, or it would break a floor) or *parked* because
  it is only temporarily blocked: by residence (in ``waiting``, a heap by the
  time the block becomes resident, mirrored in a heap by index) or by an
  in-flight promotion (``pending``, rechecked each query: in-flight
  promotions are few);
* parked rungs whose block became resident move to ``ready``, a heap by
  index; the answer is the smallest applicable index among ``ready`` and the
  cursor's next stop;
* a dead rung revives when its block returns to its from_bits: the owner
  calls ``block_changed`` after every bits change it makes or sees, and the
  block's passed rungs with the new from_bits are pushed to ``ready``.

Heap entries are checked when popped (lazy deletion), so a rung that died
while parked is dropped then. The answers equal those of a scan from the top
(tests/dataplane/test_dp_precision_walker.py checks this against the scan).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from dataplane.precision.ladder import Rung

READY, WAITING, PENDING = "ready", "waiting", "pending"


class RungWalker:
    """Contract: ``applicable`` and ``blocked`` describe the world at call
    time; the owner calls ``block_changed(block)`` whenever a block's bits
    change (any direction, any cause) before the next query."""

    def __init__(
        self,
        rungs: Sequence[Rung],
        applicable: Callable[[Rung], bool],
        is_pending: Callable[[int], bool],
        ready_at: Callable[[int], float],
        clock: Callable[[], float],
    ) -> None:
        # applicable(rung): block at from_bits, right direction, floor respected.
        # ready_at(block): the time the block's residence ends.
        self.rungs = rungs
        self._applicable = applicable
        self._is_pending = is_pending
        self._ready_at = ready_at
        self._clock = clock
        self._cursor = 0
        self._state: dict[int, str] = {}  # parked index -> READY / WAITING / PENDING
        self._ready: list[int] = []  # heap of indices
        self._waiting_by_time: list[tuple[float, int]] = []  # heap of (ready time, index)
        self._waiting_by_index: list[int] = []  # heap of indices (same entries)
        self._pending: list[int] = []
        self._by_block: dict[int, list[int]] = {}
        for i, r in enumerate(rungs):
            self._by_block.setdefault(r.block, []).append(i)

    # -- bookkeeping ---------------------------------------------------------------
    def _park(self, i: int, now: float) -> None:
        block = self.rungs[i].block
        if self._is_pending(block):
            self._state[i] = PENDING
            self._pending.append(i)
        elif self._ready_at(block) > now:
            self._state[i] = WAITING
            heapq.heappush(self._waiting_by_time, (self._ready_at(block), i))
            heapq.heappush(self._waiting_by_index, i)
        else:
            self._state[i] = READY
            heapq.heappush(self._ready, i)

    def _refresh(self, now: float) -> None:
        """Moves parked rungs whose block is resident (or no longer pending) to ready."""
        if self._pending:
            still = []
            for i in self._pending:
                if self._state.get(i) != PENDING:
                    continue
                if self._is_pending(self.rungs[i].block):
                    still.append(i)
                else:
                    del self._state[i]
                    self._park(i, now)
            self._pending = still
        while self._waiting_by_time and self._waiting_by_time[0][0] <= now:
            _, i = heapq.heappop(self._waiting_by_time)
            if self._state.get(i) == WAITING:
                del self._state[i]
                self._park(i, now)

    def block_changed(self, block: int) -> None:
        """The block's bits changed: its passed rungs may apply again."""
        for i in self._by_block.get(block, ()):
            if i >= self._cursor:
                break
            if i not in self._state and self._applicable(self.rungs[i]):
                self._state[i] = READY
                heapq.heappush(self._ready, i)

    def _usable(self, i: int, now: float, honour_residence: bool) -> bool | None:
        """True: apply it; False: blocked for now; None: dead."""
        rung = self.rungs[i]
        if not self._applicable(rung):
            return None
        if self._is_pending(rung.block) or (honour_residence and self._ready_at(rung.block) > now):
            return False
        return True

    def _first_ready(self, now: float) -> int | None:
        """Smallest ready index whose rung applies now (resident), re-parking
        or dropping the ones in front of it."""
        while self._ready:
            i = self._ready[0]
            if self._state.get(i) != READY:
                heapq.heappop(self._ready)
                continue
            verdict = self._usable(i, now, honour_residence=True)
            if verdict:
                return i
            heapq.heappop(self._ready)
            del self._state[i]
            if verdict is False:
                self._park(i, now)
        return None

    def _first_waiting(self, now: float) -> int | None:
        """Smallest index parked for residence whose rung still applies."""
        while self._waiting_by_index:
            i = self._waiting_by_index[0]
            if self._state.get(i) != WAITING:
                heapq.heappop(self._waiting_by_index)
                continue
            block = self.rungs[i].block
            if not self._applicable(self.rungs[i]):
                heapq.heappop(self._waiting_by_index)
                del self._state[i]  # dead; block_changed revives it if its block comes back
            elif self._is_pending(block):
                heapq.heappop(self._waiting_by_index)
                self._state[i] = PENDING  # its by-time entry goes stale; refresh re-parks it
                self._pending.append(i)
            else:
                return i
        return None

    def _scan(self, now: float, honour_residence: bool, limit: int | None) -> int | None:
        """Advances the cursor to the first usable rung below ``limit``."""
        while self._cursor < len(self.rungs) and (limit is None or self._cursor < limit):
            i = self._cursor
            verdict = self._usable(i, now, honour_residence)
            if verdict:
                return i
            self._cursor += 1
            if verdict is False:
                self._park(i, now)
        return None

    # -- queries ---------------------------------------------------------------------
    def first(self, honour_residence: bool = True) -> Rung | None:
        """The first rung in ladder order that applies now (module doc), or
        None. honour_residence=False counts blocks inside their residence
        time too."""
        now = self._clock()
        self._refresh(now)
        ready = self._first_ready(now)  # every parked index is below the cursor
        if honour_residence:
            found = ready if ready is not None else self._scan(now, True, None)
        else:
            waiting = self._first_waiting(now)
            parked = min((i for i in (ready, waiting) if i is not None), default=None)
            scanned = self._scan(now, False, parked)
            found = scanned if scanned is not None else parked
        return None if found is None else self.rungs[found]
