"""Telemetry link to the controlplane: reports out, precision plans in.

The dataplane dials ``Telemetry.Connect`` (telemetry.proto): a Hello first,
then a TelemetryReport every interval. Plans that come back are handed to a
callback (by default ``LatestPlan``, which keeps the newest for the precision
controller). The client runs on its own thread and event loop. If the
controlplane is down or the stream breaks, nothing else notices: the engine
keeps serving on its last plan, and the client reconnects with exponential
backoff (capped), starting a new report sequence at 1.

The Hello carries the model's sensitivity table, read once from the model
folder (dataplane/precision/sensitivity_message.py). With a token the stream
sends ``authorization: Bearer <token>`` (the controlplane's telemetry
tokens); a rejected token (UNAUTHENTICATED) is logged and retried like any
other failure.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from pagedweight.v1 import common_pb2, telemetry_pb2, telemetry_pb2_grpc

from dataplane.engine_io import EngineStats
from dataplane.model_info import ModelInfo
from dataplane.precision.sensitivity_message import load_hello_sensitivity
from dataplane.precision_state import PrecisionReporter
from dataplane.proto_convert import stats_to_proto

log = logging.getLogger(__name__)

PlanCallback = Callable[[telemetry_pb2.PrecisionPlan], None]
BACKOFF_FACTOR = 2.0
JOIN_TIMEOUT_S = 10.0
_PROJECTION = {
    "gate": common_pb2.PROJECTION_GATE,
    "up": common_pb2.PROJECTION_UP,
    "down": common_pb2.PROJECTION_DOWN,
}


class TelemetrySource(Protocol):
    """What the client reads from the engine (dataplane.engine.Engine has it all)."""

    model_info: ModelInfo

    def stats(self) -> EngineStats: ...

    def drain_routing(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def running_demand(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class TelemetryConfig:
    target: str  # controlplane "host:port"
    dataplane_id: str
    interval_ms: int = 1000
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    token: str | None = None  # bearer token of the Telemetry stream (None: send none)


class LatestPlan:
    """Thread-safe holder of the newest plan (the default plan callback)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plan: telemetry_pb2.PrecisionPlan | None = None
        self.received_total = 0

    def __call__(self, plan: telemetry_pb2.PrecisionPlan) -> None:
        with self._lock:
            self._plan = plan
            self.received_total += 1

    def get(self) -> telemetry_pb2.PrecisionPlan | None:
        with self._lock:
            return self._plan


class TelemetryClient:
    """Keeps one Connect stream open (reconnecting) and reports on a timer."""

    def __init__(
        self,
        config: TelemetryConfig,
        source: TelemetrySource,
        precision: PrecisionReporter,
        on_plan: PlanCallback,
    ) -> None:
        self.config = config
        self.source = source
        self.precision = precision
        self.on_plan = on_plan
        self.connected = threading.Event()  # set while a Welcome'd stream is open
        self.sessions_total = 0  # streams that got a Welcome
        self.reports_sent_total = 0
        self._thread = threading.Thread(target=self._thread_main, name="telemetry", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._loop_ready = threading.Event()
        self._last_drain = time.monotonic()
        self._sensitivity = load_hello_sensitivity(source.model_info.model_path)
        self._metadata = (("authorization", f"Bearer {config.token}"),) if config.token else None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._loop_ready.wait(JOIN_TIMEOUT_S)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(JOIN_TIMEOUT_S)

    def _thread_main(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._loop_ready.set()
        backoff = self.config.backoff_initial_s
        quiet = False  # after the first failure, retries log at debug level
        while not self._stop.is_set():
            welcomed = asyncio.Event()
            try:
                await self._session(welcomed)
            except Exception as err:  # any failure: stay up, retry later
                level = logging.DEBUG if quiet else logging.WARNING
                log.log(level, "telemetry stream to %s failed: %s (retrying)", self.config.target, _describe(err))
                quiet = True
            self.connected.clear()
            if welcomed.is_set():
                backoff = self.config.backoff_initial_s
                quiet = False
            if self._stop.is_set():
                break
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=backoff)
            except asyncio.TimeoutError:
                pass
            backoff = min(backoff * BACKOFF_FACTOR, self.config.backoff_max_s)

    # -- one stream ----------------------------------------------------------
    async def _session(self, welcomed: asyncio.Event) -> None:
        """Runs one stream until it breaks or stop; sets ``welcomed`` on Welcome."""
        assert self._stop is not None
        async with grpc.aio.insecure_channel(self.config.target) as channel:
            call = telemetry_pb2_grpc.TelemetryStub(channel).Connect(metadata=self._metadata)
            await call.write(telemetry_pb2.DataplaneMessage(hello=self._hello()))
            reader = asyncio.ensure_future(self._read(call, welcomed))
            stopper = asyncio.ensure_future(self._stop.wait())
            sequence = 0
            try:
                while True:
                    sleeper = asyncio.ensure_future(asyncio.sleep(self.config.interval_ms / 1000))
                    done, _ = await asyncio.wait(
                        {reader, stopper, sleeper}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if reader in done:
                        sleeper.cancel()
                        reader.result()  # re-raises a stream error
                        return  # the controlplane closed the stream
                    if stopper in done:
                        sleeper.cancel()
                        call.cancel()
                        return
                    sequence += 1
                    await call.write(telemetry_pb2.DataplaneMessage(report=self._report(sequence)))
                    self.reports_sent_total += 1
            finally:
                for task in (reader, stopper):
                    task.cancel()

    async def _read(self, call: grpc.aio.StreamStreamCall, welcomed: asyncio.Event) -> None:
        async for message in call:
            kind = message.WhichOneof("kind")
            if kind == "welcome":
                welcomed.set()
                self.sessions_total += 1
                self.connected.set()
                log.info("telemetry connected to %s (session %s)", self.config.target, message.welcome.session_id)
            elif kind == "plan":
                self.on_plan(message.plan)

    # -- messages ------------------------------------------------------------
    def _hello(self) -> telemetry_pb2.Hello:
        info = self.source.model_info
        by_projection: dict[str, list[telemetry_pb2.BlockFootprint]] = {}
        for fp in self.precision.footprints():
            by_projection.setdefault(fp.projection, []).append(
                telemetry_pb2.BlockFootprint(bits=fp.bits, bytes=fp.bytes)
            )
        hello = telemetry_pb2.Hello(
            dataplane_id=self.config.dataplane_id,
            model_name=info.name,
            num_layers=info.num_layers,
            num_experts=info.num_experts,
            top_k=info.top_k,
            supported_bits=self.precision.supported_bits(),
            footprints=[
                telemetry_pb2.ProjectionFootprint(projection=_PROJECTION[proj], by_bits=entries)
                for proj, entries in by_projection.items()
            ],
            report_interval_ms=self.config.interval_ms,
            sensitivity_error=self._sensitivity.error,
        )
        if self._sensitivity.table is not None:
            hello.sensitivity.CopyFrom(self._sensitivity.table)
        return hello

    def _report(self, sequence: int) -> telemetry_pb2.TelemetryReport:
        now = time.monotonic()
        routed, mass = self.source.drain_routing()  # [layers, experts] each
        window_ms = int((now - self._last_drain) * 1000)
        self._last_drain = now
        counters = self.precision.take_counters()
        return telemetry_pb2.TelemetryReport(
            sequence=sequence,
            window_ms=window_ms,
            routed_tokens=routed.reshape(-1).tolist(),
            router_prob_mass=mass.reshape(-1).tolist(),
            running_demand=self.source.running_demand().reshape(-1).tolist(),
            engine=stats_to_proto(self.source.stats()),
            block_bits=self.precision.block_bits(),
            predicted_quality_cost=counters.predicted_quality_cost,
            demotions=counters.demotions,
            promotions=counters.promotions,
            host_reads=counters.host_reads,
            host_read_bytes=counters.host_read_bytes,
            plan_id=counters.plan_id,
        )


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return repr(err)
