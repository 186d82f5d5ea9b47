"""The engine thread's command queue: what other threads ask of it.

Other threads never touch the engine's state; they put a ``Command`` on its
queue and the engine thread applies it between two loop iterations
(dataplane/engine.py). ``call`` commands carry a function to run there and a
reply the caller waits for.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataplane.engine_io import OutputSink
from dataplane.sequence import Sequence


@dataclass
class Command:
    kind: str  # "add", "abort", "call" or "stop"
    seq: Sequence | None = None  # "add"
    sink: OutputSink | None = None  # "add"
    request_id: str = ""  # "abort"
    fn: Callable[[], Any] | None = None  # "call": run on the engine thread
    done: threading.Event | None = None  # "call": set once answered
    result: Any = None  # "call": fn's result
    error: BaseException | None = None  # "call": what fn raised, or why it did not run

    def run_call(self) -> None:
        """Engine thread: runs ``fn`` and answers the caller. An exception is
        the caller's failure, not the engine's: it is raised in the caller."""
        assert self.fn is not None and self.done is not None
        try:
            self.result = self.fn()
        except Exception as err:
            self.error = err
        self.done.set()

    def refuse_call(self, reason: str) -> None:
        """Engine thread, shutting down: answers a call it will not run."""
        assert self.done is not None
        self.error = RuntimeError(reason)
        self.done.set()


def call_on_engine_thread(commands: queue.Queue[Command], fn: Callable[[], Any], timeout_s: float,
                          engine_error: Callable[[], BaseException | None]) -> Any:
    """Queues a ``call`` of ``fn`` and waits for its answer; returns fn's
    result or raises its exception (TimeoutError after ``timeout_s``)."""
    cmd = Command("call", fn=fn, done=threading.Event())
    commands.put(cmd)
    assert cmd.done is not None
    if not cmd.done.wait(timeout_s):
        raise TimeoutError(f"the engine thread did not run {fn!r} (error: {engine_error()!r})")
    if cmd.error is not None:
        raise cmd.error
    return cmd.result
