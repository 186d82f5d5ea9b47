"""The gateway's narrow view of the dataplane, and its gRPC implementation.

The gateway needs three things from the dataplane: the model description
(tokenizer, template, limits), token generation as a stream, and an engine
snapshot for /metrics. `DataplaneClient` is that interface; failures surface
as `DataplaneError` with a transport-free `kind`, so the HTTP layer never sees
gRPC types.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from grpc import aio

from pagedweight.v1 import inference_pb2, inference_pb2_grpc

# tokenizer.json of large vocabularies exceeds gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Backoff between GetModelInfo attempts while the dataplane comes up.
INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# gRPC's own reconnect backoff grows to 120 s by default; a dataplane that
# restarts must be noticed within seconds.
RECONNECT_BACKOFF_MS = (100, 1000)  # (min/initial, max)
# Engine snapshots are cheap; a slow answer means the dataplane is in trouble.
STATS_TIMEOUT_S = 2.0


class DataplaneErrorKind(enum.Enum):
    UNAVAILABLE = "unavailable"  # not reachable / not serving
    INVALID_ARGUMENT = "invalid_argument"  # the dataplane rejected the request
    OVERLOADED = "overloaded"  # the engine's queue is full
    TIMEOUT = "timeout"  # the deadline passed
    INTERNAL = "internal"  # anything else


class DataplaneError(Exception):
    def __init__(self, kind: DataplaneErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class DataplaneClient(Protocol):
    """What the gateway calls. Implementations must be usable from one asyncio
    event loop (the server's); they may connect lazily on first use."""

    async def model_info(self) -> inference_pb2.ModelInfo:
        """The served model's description. Waits (bounded) for a dataplane that
        is not up yet; raises DataplaneError(UNAVAILABLE) when it stays down."""
        ...

    def generate(
        self, request: inference_pb2.GenerateRequest, timeout_s: float | None = None
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Streams responses until one carries a finish reason. Closing the
        iterator early (aclose) or cancelling the consuming task aborts the
        request at the dataplane. Raises DataplaneError."""
        ...

    async def engine_stats(self) -> inference_pb2.EngineStats:
        """A fresh engine snapshot; raises DataplaneError."""
        ...

    async def close(self) -> None:
        """Releases connections; the client is unusable afterwards."""
        ...


_KIND_BY_STATUS = {
    grpc.StatusCode.UNAVAILABLE: DataplaneErrorKind.UNAVAILABLE,
    grpc.StatusCode.INVALID_ARGUMENT: DataplaneErrorKind.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE: DataplaneErrorKind.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: DataplaneErrorKind.OVERLOADED,
    grpc.StatusCode.DEADLINE_EXCEEDED: DataplaneErrorKind.TIMEOUT,
}


def _translate(address: str, error: aio.AioRpcError) -> DataplaneError:
    kind = _KIND_BY_STATUS.get(error.code(), DataplaneErrorKind.INTERNAL)
    detail = error.details() or error.code().name
    if kind is DataplaneErrorKind.UNAVAILABLE:
        return DataplaneError(kind, f"dataplane at {address} is unavailable: {detail}")
    return DataplaneError(kind, detail)


class GrpcDataplaneClient:
    """`DataplaneClient` over the `Inference` gRPC service (grpc.aio).

    The channel is created on first use, inside the caller's event loop.
    `model_info` is fetched once and cached (one dataplane serves one model);
    while the dataplane is down, callers share one retrying fetch that gives
    up after `wait_s`.
    """

    def __init__(self, address: str, wait_s: float) -> None:
        self.address = address
        self._wait_s = wait_s
        self._channel: aio.Channel | None = None
        self._stub: inference_pb2_grpc.InferenceStub | None = None
        self._info: inference_pb2.ModelInfo | None = None
        self._info_task: asyncio.Task[inference_pb2.ModelInfo] | None = None

    def _inference(self) -> inference_pb2_grpc.InferenceStub:
        if self._stub is None:
            self._channel = aio.insecure_channel(
                self.address,
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
                ],
            )
            self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        return self._stub

    async def model_info(self) -> inference_pb2.ModelInfo:
        if self._info is not None:
            return self._info
        task = self._info_task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._fetch_model_info())
            # Keep the exception "retrieved" even when every waiter went away.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._info_task = task
        # Shielded: a caller that disconnects must not cancel the shared fetch.
        return await asyncio.shield(task)

    async def _fetch_model_info(self) -> inference_pb2.ModelInfo:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        backoff = INITIAL_BACKOFF_S
        while True:
            remaining = deadline - loop.time()
            try:
                info = await self._inference().GetModelInfo(
                    inference_pb2.GetModelInfoRequest(), timeout=max(remaining, 0.0), wait_for_ready=True
                )
            except aio.AioRpcError as error:
                retryable = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retryable:
                    raise _translate(self.address, error) from error
                if loop.time() + backoff >= deadline:
                    raise DataplaneError(
                        DataplaneErrorKind.UNAVAILABLE,
                        f"dataplane at {self.address} did not answer within {self._wait_s:g}s",
                    ) from error
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
                continue
            self._info = info
            return info

    async def generate(
        self, request: inference_pb2.GenerateRequest, timeout_s: float | None = None
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        call = self._inference().Generate(request, timeout=timeout_s)
        try:
            async for response in call:
                yield response
        except aio.AioRpcError as error:
            raise _translate(self.address, error) from error
        finally:
            # No-op when the call already finished; otherwise tells the
            # dataplane to abort the request and free its KV blocks.
            call.cancel()

    async def engine_stats(self) -> inference_pb2.EngineStats:
        try:
            return await self._inference().GetEngineStats(
                inference_pb2.GetEngineStatsRequest(), timeout=STATS_TIMEOUT_S
            )
        except aio.AioRpcError as error:
            raise _translate(self.address, error) from error

    async def close(self) -> None:
        if self._info_task is not None and not self._info_task.done():
            self._info_task.cancel()
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
