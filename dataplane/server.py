"""gRPC server of the dataplane: the Inference service and standard health.

grpc.aio on one event loop. ``DataplaneServer`` is the async object;
``ServerThread`` runs one on a background thread with its own loop (tests,
and the CLI, which keeps its main thread for signals and telemetry).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from pagedweight.v1 import inference_pb2, inference_pb2_grpc

from dataplane.engine import Engine
from dataplane.engine_io import InvalidRequest, QueueFull
from dataplane.inference_service import InferenceService

log = logging.getLogger(__name__)

SERVICE_NAME = "pagedweight.v1.Inference"
STOP_GRACE_S = 2.0
START_TIMEOUT_S = 30.0


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    """Maps InferenceService onto gRPC, errors onto status codes."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        stream = self.service.generate(request)
        try:
            async for response in stream:
                yield response
        except InvalidRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except QueueFull as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        finally:
            # On cancellation the handler task is cancelled mid-await; closing
            # the stream runs its finally, which aborts the request in the engine.
            await stream.aclose()

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ModelInfo:
        return self.service.model_info()

    async def GetEngineStats(
        self, request: inference_pb2.GetEngineStatsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EngineStats:
        return self.service.engine_stats()


class DataplaneServer:
    """An aio gRPC server bound to ``host:port`` (0 picks a free port)."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self.host = host
        self.requested_port = port
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port."""
        server = grpc.aio.server()
        inference_pb2_grpc.add_InferenceServicer_to_server(InferenceServicer(InferenceService(self.engine)), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = server.add_insecure_port(f"{self.host}:{self.requested_port}")
        if self.port == 0:
            raise OSError(f"cannot bind {self.host}:{self.requested_port}")
        await server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        log.info("dataplane serving on %s", self.address)
        return self.port

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        if self._server is None:
            return
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.stop(grace)
        self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


class ServerThread:
    """Runs a DataplaneServer on a background thread with its own event loop."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = DataplaneServer(engine, host, port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as err:
            self._error = err
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    def start(self) -> int:
        """Starts the thread; returns the bound port once serving."""
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError("gRPC server did not start")
        if self._error is not None:
            raise self._error
        return self.server.port

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop)
        future.result(timeout=START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
