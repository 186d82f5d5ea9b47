"""Keeps the stack's processes running: one that exits is started again.

A fault in one process must not take the others' requests with it. The
dataplane keeps serving (on its last precision ladder) while the controlplane
is away and reconnects when it is back; the gateway answers 503 while the
dataplane is away and serves again once it answers. So the supervisor restarts
only the process that exited, never the whole stack, and the requests the
other two hold go on.

A process that cannot stay up (a port taken, a model that fails to load) would
be restarted forever; `RestartPolicy` bounds that: past `max_restarts`
restarts of one process inside `window_s` the supervisor reports it and the
caller stops the stack, as it did before there was a supervisor.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RestartPolicy:
    """When an exited process is started again.

    The n-th restart of a process inside the window waits
    ``min(initial_backoff_s * 2**(n-1), max_backoff_s)`` after the exit is
    noticed, so a crash loop does not spin. ``max_restarts`` 0 restarts
    nothing: the first exit stops the stack.
    """

    max_restarts: int = 5
    window_s: float = 300.0
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"need 0 <= initial_backoff_s <= max_backoff_s, got {self.initial_backoff_s}, {self.max_backoff_s}"
            )

    def backoff_s(self, restarts_in_window: int) -> float:
        """Delay before the next restart of a process that already restarted
        ``restarts_in_window`` times inside the window."""
        return min(self.initial_backoff_s * 2.0**restarts_in_window, self.max_backoff_s)


class SupervisedStack(Protocol):
    """What the supervisor needs of the stack (`launcher.processes.Stack`)."""

    def exited(self) -> dict[str, int]:
        """Processes that were started and have exited: name -> exit code."""
        ...

    def restart(self, name: str) -> None:
        """Starts ``name`` again and waits until it is healthy. On failure it
        raises and leaves ``name`` registered as exited, so that the next
        round sees it again."""
        ...


class Supervisor:
    """Restarts the stack's exited processes under a `RestartPolicy`.

    `check` is one round; the caller calls it periodically from one thread.
    A restart blocks that thread until the process is healthy (or failed).
    """

    def __init__(
        self,
        stack: SupervisedStack,
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._stack = stack
        self._policy = policy
        self._clock = clock
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        # name -> monotonic times of its restarts (pruned to the window)
        self._restarts: dict[str, list[float]] = {}
        # name -> when its pending restart is due
        self._due: dict[str, float] = {}

    def restarts(self, name: str) -> int:
        """Restarts of ``name`` inside the current window."""
        return len(self._recent(name, self._clock()))

    def check(self) -> str | None:
        """One round: schedules a restart for each newly exited process and
        performs those that are due. Returns the name of a process that
        exited more often than the policy allows (the caller should stop the
        stack), else None."""
        now = self._clock()
        for name, code in sorted(self._stack.exited().items()):
            if name in self._due:
                continue
            recent = self._recent(name, now)
            if len(recent) >= self._policy.max_restarts:
                self._log(
                    f"{name} exited with code {code} after {len(recent)} restarts in "
                    f"{self._policy.window_s:g} s; giving up"
                )
                return name
            delay = self._policy.backoff_s(len(recent))
            self._due[name] = now + delay
            self._log(f"{name} exited with code {code}; restarting it in {delay:.1f} s")
        for name, due in sorted(self._due.items(), key=lambda item: item[1]):
            if due > now:
                continue
            del self._due[name]
            self._restarts.setdefault(name, []).append(now)
            try:
                self._stack.restart(name)
            except (RuntimeError, TimeoutError, OSError) as exc:
                self._log(f"restarting {name} failed: {exc}")
            else:
                self._log(f"{name} restarted")
        return None

    def _recent(self, name: str, now: float) -> list[float]:
        recent = [t for t in self._restarts.get(name, []) if now - t < self._policy.window_s]
        self._restarts[name] = recent
        return recent
