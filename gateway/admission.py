"""Admission control: bounded work runs, a bounded number of requests wait.

Mechanism only; the limits come from GatewaySettings. Work is counted in
slots, one per dataplane sequence a request runs (its prompts x n choices),
so a request of 16 choices weighs what 16 single ones do; one that asks for
more slots than exist takes them all and runs alone. Waiters are served in
arrival order (FIFO, no overtaking); a request that finds the slots and the
queue full is rejected at once (the HTTP layer answers 429 + Retry-After).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass


class AdmissionRejected(Exception):
    """Both the running slots and the waiting queue are full."""


@dataclass
class _Waiter:
    future: asyncio.Future[None]
    slots: int


class AdmissionController:
    """A weighted counting semaphore with a bounded FIFO queue. Must be used
    from one event loop. Released slots go to the oldest waiters first, so a
    newcomer never overtakes the queue."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("need max_running >= 1 and max_waiting >= 0")
        self.max_running = max_running
        self.max_waiting = max_waiting
        self._slots_used = 0
        self._requests = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def running(self) -> int:
        """Requests holding slots."""
        return self._requests

    @property
    def slots_used(self) -> int:
        return self._slots_used

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, sequences: int = 1) -> int:
        """Takes the slots of a request of ``sequences`` sequences, waiting in
        line if needed; returns the slots taken (give them to ``release``).
        Raises AdmissionRejected when the line is full. Cancellation while
        waiting leaves the line."""
        slots = min(max(sequences, 1), self.max_running)
        if not self._waiters and self._slots_used + slots <= self.max_running:
            self._take(slots)
            return slots
        if len(self._waiters) >= self.max_waiting:
            raise AdmissionRejected(
                f"{self._requests} requests running ({self._slots_used} of {self.max_running} sequence slots) "
                f"and {len(self._waiters)} waiting; try again later"
            )
        waiter = _Waiter(asyncio.get_running_loop().create_future(), slots)
        self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(slots)  # the slots were handed over just as we left
            elif waiter in self._waiters:  # _grant may have dropped it already
                self._waiters.remove(waiter)
                self._grant()  # the ones behind it may fit now
            raise
        return slots

    def release(self, slots: int = 1) -> None:
        """Returns a request's slots; the oldest waiters that fit get them."""
        self._slots_used -= slots
        self._requests -= 1
        self._grant()

    @asynccontextmanager
    async def slot(self, sequences: int = 1) -> AsyncIterator[None]:
        slots = await self.acquire(sequences)
        try:
            yield
        finally:
            self.release(slots)

    def _take(self, slots: int) -> None:
        self._slots_used += slots
        self._requests += 1

    def _grant(self) -> None:
        while self._waiters and self._slots_used + self._waiters[0].slots <= self.max_running:
            waiter = self._waiters.popleft()
            if waiter.future.done():  # cancelled while queued
                continue
            self._take(waiter.slots)
            waiter.future.set_result(None)
