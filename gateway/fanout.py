"""Runs several async streams at once and merges their items, watching for
the HTTP client going away.

Used for n > 1 choices (one dataplane request each) and for client-disconnect
cancellation of both streaming and non-streaming requests: on disconnect, on
error, or when the consumer stops, every stream is closed, which cancels its
gRPC call so the dataplane frees the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before the response was complete."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the ASGI server reports `http.disconnect`. Only valid after
    the request body has been read (FastAPI has parsed it by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


@dataclass(frozen=True)
class _Finished:
    pass


@dataclass(frozen=True)
class _Failed:
    error: Exception


@dataclass(frozen=True)
class _Item(Generic[T]):
    value: T


_DISCONNECTED = object()


async def merge_streams(
    streams: Sequence[AsyncIterator[T]], disconnected: Callable[[], Awaitable[None]] | None = None
) -> AsyncIterator[T]:
    """Yields items of all `streams` in arrival order (each stream's own order
    kept) until all are exhausted. Raises the first stream error, or
    ClientDisconnected when `disconnected()` returns first. On any exit all
    streams are closed and their tasks awaited."""
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def pump(stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream):  # type: ignore[type-var]
                async for value in stream:
                    queue.put_nowait(_Item(value))
            queue.put_nowait(_Finished())
        except Exception as error:  # handed to the consumer, which re-raises it
            queue.put_nowait(_Failed(error))

    async def watch() -> None:
        assert disconnected is not None
        await disconnected()
        queue.put_nowait(_DISCONNECTED)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    if disconnected is not None:
        tasks.append(asyncio.create_task(watch()))
    try:
        running = len(streams)
        while running:
            event = await queue.get()
            if isinstance(event, _Item):
                yield event.value
            elif isinstance(event, _Finished):
                running -= 1
            elif isinstance(event, _Failed):
                raise event.error
            else:
                raise ClientDisconnected()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
