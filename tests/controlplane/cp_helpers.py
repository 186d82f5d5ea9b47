"""Helpers of the controlplane tests: Hello/report builders, a fake dataplane
speaking the Telemetry stream, and the test server config."""

from __future__ import annotations

import queue
import threading
from typing import Iterator

import grpc
import numpy as np

from controlplane.activity import ActivitySnapshot, normalize_rows
from controlplane.config import ControlplaneConfig
from controlplane.planner import Constraints, ModelShape, PlanInputs
from controlplane.sensitivity import fallback_table
from pagedweight.v1 import common_pb2, inference_pb2, telemetry_pb2, telemetry_pb2_grpc

TOKEN = "test-token"
VIEWS = (2, 3, 4, 6, 8)
# Bytes of one block per bits (gate/up smaller than down to tell them apart).
BYTES_PER_BIT = {common_pb2.PROJECTION_GATE: 1024, common_pb2.PROJECTION_UP: 1024, common_pb2.PROJECTION_DOWN: 2048}
RECV_TIMEOUT_S = 10.0


def make_hello(dataplane_id: str = "dp-1", layers: int = 2, experts: int = 4, top_k: int = 2,
               table: telemetry_pb2.SensitivityTable | None = None, views: tuple[int, ...] = VIEWS,
               sensitivity_error: str = "") -> telemetry_pb2.Hello:
    footprints = [
        telemetry_pb2.ProjectionFootprint(
            projection=proj,
            by_bits=[telemetry_pb2.BlockFootprint(bits=b, bytes=b * per_bit) for b in (0, *views)],
        )
        for proj, per_bit in BYTES_PER_BIT.items()
    ]
    hello = telemetry_pb2.Hello(
        dataplane_id=dataplane_id, model_name="tiny-moe", num_layers=layers, num_experts=experts, top_k=top_k,
        supported_bits=list(views), footprints=footprints, report_interval_ms=100,
        sensitivity_error=sensitivity_error,
    )
    if table is not None:
        hello.sensitivity.CopyFrom(table)
    return hello


def table_message(cost: np.ndarray, source: str = "dp-host:/m/sensitivity.json") -> telemetry_pb2.SensitivityTable:
    """The Hello's table of a cost array [L, E, 3, bits]."""
    return telemetry_pb2.SensitivityTable(
        source=source, format_version=1, units="nats", num_layers=cost.shape[0], num_experts=cost.shape[1],
        num_projections=cost.shape[2], bits=[0, 2, 3, 4, 6, 8], cost=cost.reshape(-1).tolist(),
    )


def make_report(seq: int, routed: np.ndarray, block_bits: np.ndarray | None = None, window_ms: int = 100,
                free_pages: int = 10, total_pages: int = 100) -> telemetry_pb2.TelemetryReport:
    """routed: [L, E] routed tokens (prob mass = routed / top_k-ish stand-in)."""
    report = telemetry_pb2.TelemetryReport(
        sequence=seq, window_ms=window_ms,
        routed_tokens=[int(x) for x in routed.reshape(-1)],
        router_prob_mass=[float(x) * 0.5 for x in routed.reshape(-1)],
        engine=inference_pb2.EngineStats(
            running_requests=1, arena=inference_pb2.ArenaStats(free_pages=free_pages, total_pages=total_pages)
        ),
        predicted_quality_cost=1.5,
    )
    if block_bits is not None:
        report.block_bits.extend(int(b) for b in block_bits.reshape(-1))
    return report


class FakeDataplane:
    """A Telemetry client: send() queues messages on the stream, recv()
    returns the next ControlplaneMessage or raises the stream's RpcError."""

    def __init__(self, address: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self._out: queue.Queue = queue.Queue()
        self._in: queue.Queue = queue.Queue()
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
        self._call = telemetry_pb2_grpc.TelemetryStub(self.channel).Connect(self._requests(), metadata=metadata)
        threading.Thread(target=self._pump, daemon=True).start()

    def _requests(self) -> Iterator[telemetry_pb2.DataplaneMessage]:
        while (msg := self._out.get()) is not None:
            yield msg

    def _pump(self) -> None:
        try:
            for msg in self._call:
                self._in.put(msg)
            self._in.put(StopIteration())
        except grpc.RpcError as exc:
            self._in.put(exc)

    def hello(self, hello: telemetry_pb2.Hello) -> None:
        self._out.put(telemetry_pb2.DataplaneMessage(hello=hello))

    def report(self, report: telemetry_pb2.TelemetryReport) -> None:
        self._out.put(telemetry_pb2.DataplaneMessage(report=report))

    def recv(self, timeout: float = RECV_TIMEOUT_S) -> telemetry_pb2.ControlplaneMessage:
        item = self._in.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def recv_plan(self, timeout: float = RECV_TIMEOUT_S) -> telemetry_pb2.PrecisionPlan:
        msg = self.recv(timeout)
        assert msg.WhichOneof("kind") == "plan", msg
        return msg.plan

    def close(self) -> None:
        self._out.put(None)
        self._call.cancel()
        self.channel.close()


def make_config(db_path, **overrides) -> ControlplaneConfig:
    values = dict(host="127.0.0.1", port=0, db_path=str(db_path), admin_tokens=(TOKEN,), plan_min_interval_s=0.05)
    values.update(overrides)
    return ControlplaneConfig(**values)


# Planner tests' model: layers, experts.
PLAN_L, PLAN_E = 2, 4
PER_BIT = (1024, 1024, 2048)  # gate, up, down bytes per bit


def make_shape(views=VIEWS) -> ModelShape:
    return ModelShape(PLAN_L, PLAN_E, 2, views, tuple({0: 0, **{b: b * per for b in views}} for per in PER_BIT))


def activity(routed=None, demand=None) -> ActivitySnapshot:
    routed = np.ones((PLAN_L, PLAN_E)) if routed is None else np.asarray(routed, dtype=float)
    return ActivitySnapshot(
        routed_share=normalize_rows(routed), prob_share=normalize_rows(routed),
        demand_share=normalize_rows(np.zeros((PLAN_L, PLAN_E)) if demand is None else np.asarray(demand, float)),
        has_demand=demand is not None,
    )


def make_inputs(shape=None, table=None, current=None, floors=(), pins=(), budget=0, act=None) -> PlanInputs:
    shape = shape or make_shape()
    sizes = tuple(float(shape.bytes_at(p, shape.ceiling_bits)) for p in range(3))
    return PlanInputs(
        shape=shape,
        sensitivity=table or fallback_table(PLAN_L, PLAN_E, sizes, "test"),
        activity=act or activity(),
        current_bits=np.full((PLAN_L, PLAN_E, 3), shape.ceiling_bits) if current is None else current,
        constraints=Constraints(tuple(floors), tuple(pins), budget),
    )
