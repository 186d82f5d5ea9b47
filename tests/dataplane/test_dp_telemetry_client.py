"""Telemetry link against a fake controlplane (a real gRPC server).

Hello first, reports on a timer, plans handed to the callback; when the
controlplane goes away the dataplane keeps serving, and it reconnects (new
Hello, sequence restarting at 1) when the controlplane comes back.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams
from pagedweight.v1 import common_pb2, telemetry_pb2, telemetry_pb2_grpc

TIMEOUT_S = 30
INTERVAL_MS = 50
PLAN_AFTER_REPORTS = 2
POOL_WORKERS = 4


class FakeControlplane(telemetry_pb2_grpc.TelemetryServicer):
    """Records every message; sends Welcome, then a plan after a few reports."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hellos: list[telemetry_pb2.Hello] = []
        self.metadata: list[dict[str, str]] = []  # per session: the stream's invocation metadata
        self.sessions: list[list[telemetry_pb2.TelemetryReport]] = []

    def Connect(self, request_iterator, context):
        first = next(request_iterator)
        if first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be a Hello")
        with self.lock:
            self.hellos.append(first.hello)
            self.metadata.append(dict(context.invocation_metadata()))
            reports: list[telemetry_pb2.TelemetryReport] = []
            self.sessions.append(reports)
            session = len(self.sessions)
        yield telemetry_pb2.ControlplaneMessage(welcome=telemetry_pb2.Welcome(session_id=f"s{session}"))
        for message in request_iterator:
            with self.lock:
                reports.append(message.report)
            if len(reports) == PLAN_AFTER_REPORTS:
                plan = telemetry_pb2.PrecisionPlan(plan_id=100 + session, low_watermark=0.1, high_watermark=0.3)
                yield telemetry_pb2.ControlplaneMessage(plan=plan)

    def reports(self, session: int) -> list[telemetry_pb2.TelemetryReport]:
        with self.lock:
            return list(self.sessions[session]) if session < len(self.sessions) else []


def start_fake(fake: FakeControlplane, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(POOL_WORKERS))
    telemetry_pb2_grpc.add_TelemetryServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def generate(dataplane: Dataplane, rid: str, n: int) -> list[int]:
    sink = QueueSink()
    dataplane.engine.add_request(rid, [5, 6, 7, 8], SamplingParams(max_tokens=n, ignore_eos=True), sink)
    return [t for out in sink.outputs(timeout=TIMEOUT_S) for t in out.new_token_ids]


@pytest.fixture
def dataplane_with(random_ckpt):
    started: list[Dataplane] = []

    def make(controlplane: str, **overrides) -> Dataplane:
        config = DataplaneConfig(
            **overrides,
            model_path=str(random_ckpt),
            cpu_arena_bytes=4 << 20,
            controlplane=controlplane,
            dataplane_id="dp-test",
            telemetry_interval_ms=INTERVAL_MS,
            telemetry_backoff_initial_s=0.05,
            telemetry_backoff_max_s=0.2,
        )
        dataplane = Dataplane(config)
        dataplane.start()
        started.append(dataplane)
        return dataplane

    yield make
    for dataplane in started:
        dataplane.stop()


def test_hello_reports_and_plans(dataplane_with):
    fake = FakeControlplane()
    server, port = start_fake(fake)
    try:
        dp = dataplane_with(f"127.0.0.1:{port}")
        info = dp.engine.model_info
        wait_for(lambda: len(fake.reports(0)) >= PLAN_AFTER_REPORTS + 1, "reports")
        hello = fake.hellos[0]
        assert hello.dataplane_id == "dp-test" and hello.model_name == info.name
        assert (hello.num_layers, hello.num_experts, hello.top_k) == (info.num_layers, info.num_experts, info.top_k)
        assert list(hello.supported_bits) == [2, 3, 4, 6, 8] and hello.report_interval_ms == INTERVAL_MS
        # The random checkpoint has no sensitivity.json: no table, and why.
        assert not hello.HasField("sensitivity") and "sensitivity.json not found" in hello.sensitivity_error
        assert "authorization" not in fake.metadata[0]  # no token configured: none sent
        projections = {fp.projection: {b.bits: b.bytes for b in fp.by_bits} for fp in hello.footprints}
        assert set(projections) == {common_pb2.PROJECTION_GATE, common_pb2.PROJECTION_UP, common_pb2.PROJECTION_DOWN}
        assert all(by[0] == 0 and by[8] > 0 for by in projections.values())
        wait_for(lambda: dp.plans.get() is not None, "the plan")
        assert dp.plans.get().plan_id == 101
        generated = generate(dp, "g1", 6)
        assert len(generated) == 6
        first_count = len(fake.reports(0))
        wait_for(lambda: len(fake.reports(0)) >= first_count + 2, "reports after generation")
        reports = fake.reports(0)
        assert [r.sequence for r in reports] == list(range(1, len(reports) + 1))
        blocks = info.num_layers * info.num_experts * 3
        assert all(list(r.block_bits) == [8] * blocks for r in reports)
        assert all(len(r.routed_tokens) == len(r.running_demand) == info.num_layers * info.num_experts for r in reports)
        routed = sum(sum(r.routed_tokens) for r in reports)
        computed = 4 + 5  # prompt + 5 decode steps
        assert routed == computed * info.top_k * info.num_layers
        last = reports[-1].engine
        assert last.arena.total_pages == dp.engine.arena.num_pages and last.kv_block_size == 16
        assert last.generated_tokens_total == 6
        assert all(r.window_ms >= 0 for r in reports)
    finally:
        server.stop(0)


def test_serving_continues_while_the_controlplane_is_down_and_it_reconnects(dataplane_with):
    fake = FakeControlplane()
    server, port = start_fake(fake)
    dp = dataplane_with(f"127.0.0.1:{port}")
    try:
        wait_for(lambda: len(fake.reports(0)) >= 1, "the first session")
        assert dp.telemetry is not None and dp.telemetry.connected.is_set()
        server.stop(0)
        wait_for(lambda: not dp.telemetry.connected.is_set(), "the disconnect")
        # Down: generation goes on, and its routing waits in the window.
        assert len(generate(dp, "while-down", 5)) == 5
        time.sleep(3 * INTERVAL_MS / 1000)  # a few failed reconnects
        server, _ = start_fake(fake, port)
        wait_for(lambda: len(fake.reports(1)) >= 2, "reports of the second session")
        assert len(fake.hellos) == 2 and dp.telemetry.sessions_total == 2
        second = fake.reports(1)
        assert [r.sequence for r in second[:2]] == [1, 2]
        total_routed = sum(sum(r.routed_tokens) for session in (0, 1) for r in fake.reports(session))
        info = dp.engine.model_info
        assert total_routed == (4 + 4) * info.top_k * info.num_layers  # nothing lost while down
        wait_for(lambda: dp.plans.get() is not None and dp.plans.get().plan_id == 102, "the new plan")
    finally:
        server.stop(0)


def test_controlplane_absent_from_the_start(dataplane_with):
    fake = FakeControlplane()
    probe, port = start_fake(fake)
    probe.stop(0)  # a port nobody listens on (for now)
    dp = dataplane_with(f"127.0.0.1:{port}")
    assert len(generate(dp, "alone", 3)) == 3
    assert not dp.telemetry.connected.is_set()
    server, _ = start_fake(fake, port)
    try:
        wait_for(lambda: dp.telemetry.connected.is_set() and len(fake.reports(0)) >= 1, "a late connect")
    finally:
        server.stop(0)


def test_stream_carries_the_configured_token(dataplane_with):
    fake = FakeControlplane()
    server, port = start_fake(fake)
    try:
        dataplane_with(f"127.0.0.1:{port}", controlplane_token="tele-secret")
        wait_for(lambda: len(fake.hellos) >= 1, "the Hello")
        assert fake.metadata[0]["authorization"] == "Bearer tele-secret"
    finally:
        server.stop(0)


@pytest.mark.parametrize("token, connects", [("tele-secret", True), ("wrong", False), (None, False)])
def test_real_controlplane_requires_the_telemetry_token(dataplane_with, tmp_path, token, connects):
    from controlplane.config import ControlplaneConfig
    from controlplane.server import ControlplaneServer

    cp = ControlplaneServer(ControlplaneConfig(
        port=0, db_path=str(tmp_path / "cp.sqlite3"), admin_tokens=("admin",), telemetry_tokens=("tele-secret",),
    )).start()
    try:
        dp = dataplane_with(cp.address, controlplane_token=token)
        if connects:
            wait_for(lambda: dp.plans.get() is not None, "a plan from the controlplane")
            assert dp.telemetry.connected.is_set()
        else:
            time.sleep(0.5)  # several reconnect attempts at the test's backoff
            assert dp.telemetry.sessions_total == 0 and dp.plans.get() is None
    finally:
        cp.stop(grace_s=0)
