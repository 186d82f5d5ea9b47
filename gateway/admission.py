"""Admission control: a bounded number of requests run, a bounded number wait.

Mechanism only; the limits come from GatewaySettings. Waiters are served in
arrival order (FIFO); a request that finds both the running slots and the
queue full is rejected at once (the HTTP layer answers 429 + Retry-After).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class AdmissionRejected(Exception):
    """Both the running slots and the waiting queue are full."""


class AdmissionController:
    """Counting semaphore with a bounded FIFO queue. Must be used from one
    event loop. A released slot is handed directly to the oldest waiter, so a
    newcomer can never overtake the queue."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("need max_running >= 1 and max_waiting >= 0")
        self.max_running = max_running
        self.max_waiting = max_waiting
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Takes a slot, waiting in line if needed; raises AdmissionRejected
        when the line is full. Cancellation while waiting leaves the line."""
        if self._running < self.max_running and not self._waiters:
            self._running += 1
            return
        if len(self._waiters) >= self.max_waiting:
            raise AdmissionRejected(
                f"{self._running} requests running and {len(self._waiters)} waiting; try again later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we left
            elif waiter in self._waiters:  # release() may have dropped it already
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Gives the slot to the oldest waiter, or frees it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves; _running is unchanged
                return
        self._running -= 1

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
