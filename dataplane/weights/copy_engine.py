"""Host-to-arena copy engines for promotions.

A promotion submits a batch of (destination view, source tensor) copies and
gets a handle; the store commits the new bitwidth only once ``handle.done()``
is true (or after ``handle.wait()``), so no reader ever sees a field whose
bytes are still in flight.

* ``SyncCopyEngine``: copies at submit time (CPU arenas); the handle is done
  at once but still goes through the store's commit path.
* ``CudaCopyEngine``: copies on a side CUDA stream after the stream that
  issued the promotion (so pages just freed by a demotion are not
  overwritten while an earlier kernel may still read them), and records an
  event the handle polls.

Tests add engines that hold copies back to simulate slow transfers.
"""

from __future__ import annotations

from typing import Protocol

import torch

Copy = tuple[torch.Tensor, torch.Tensor]  # (destination view in the arena, host source)


class CopyHandle(Protocol):
    def done(self) -> bool:
        """True once every copy of the batch has landed (never blocks)."""
        ...

    def wait(self) -> None:
        """Blocks until the batch has landed."""
        ...


class CopyEngine(Protocol):
    def submit(self, copies: list[Copy]) -> CopyHandle:
        """Starts the copies; the sources must stay alive until the handle is done."""
        ...


class _DoneHandle:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


class SyncCopyEngine:
    """Copies synchronously (CPU)."""

    def submit(self, copies: list[Copy]) -> CopyHandle:
        for dst, src in copies:
            dst.copy_(src)
        return _DoneHandle()


class _EventHandle:
    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def done(self) -> bool:
        return self._event.query()

    def wait(self) -> None:
        self._event.synchronize()


class CudaCopyEngine:
    """Asynchronous host-to-device copies on one side stream (sources must be pinned)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)

    def submit(self, copies: list[Copy]) -> CopyHandle:
        issuing = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(issuing)
        with torch.cuda.stream(self._stream):
            for dst, src in copies:
                dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return _EventHandle(event)


def default_copy_engine(device: torch.device) -> CopyEngine:
    return CudaCopyEngine(device) if device.type == "cuda" else SyncCopyEngine()
