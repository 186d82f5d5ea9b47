"""Telemetry authentication and the controlplane's Prometheus /metrics,
over real gRPC and HTTP."""

from __future__ import annotations

import time
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.server import ControlplaneServer
from launcher.processes import free_ports
from pagedweight.v1 import admin_pb2, admin_pb2_grpc
from tests.controlplane.cp_helpers import TOKEN, FakeDataplane, make_config, make_hello, make_report

TELEMETRY_TOKEN = "tele-token"


@pytest.fixture
def secured(db_path):
    srv = ControlplaneServer(make_config(db_path, telemetry_tokens=(TELEMETRY_TOKEN,))).start()
    made: list[FakeDataplane] = []

    def connect(token: str | None) -> FakeDataplane:
        dp = FakeDataplane(srv.address, token=token)
        made.append(dp)
        dp.hello(make_hello())
        return dp

    yield srv, connect
    for dp in made:
        dp.close()
    srv.stop(grace_s=0)


@pytest.mark.parametrize("token", [None, "wrong", TOKEN])  # TOKEN: an admin token is not a telemetry token
def test_telemetry_needs_a_telemetry_token(secured, token):
    _, connect = secured
    dp = connect(token)
    with pytest.raises(grpc.RpcError) as err:
        dp.recv()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_telemetry_token_opens_the_stream_but_not_admin(secured):
    srv, connect = secured
    dp = connect(TELEMETRY_TOKEN)
    assert dp.recv().WhichOneof("kind") == "welcome"
    assert dp.recv_plan().plan_id >= 1
    with grpc.insecure_channel(srv.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), metadata=(("authorization", f"Bearer {TELEMETRY_TOKEN}"),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_empty_telemetry_token_is_refused(db_path):
    with pytest.raises(ValueError):
        make_config(db_path, telemetry_tokens=("",))


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_metrics_over_http(tmp_path):
    port_a, port_b = free_ports(2)
    srv = ControlplaneServer(make_config(tmp_path / "a.sqlite3", metrics_port=port_a)).start()
    other = ControlplaneServer(make_config(tmp_path / "b.sqlite3", metrics_port=port_b)).start()
    dp = FakeDataplane(srv.address)
    channel = grpc.insecure_channel(srv.address)
    try:
        assert srv.metrics_port == port_a
        dp.hello(make_hello())
        assert dp.recv().WhichOneof("kind") == "welcome"
        plan = dp.recv_plan()
        dp.report(make_report(1, np.ones((2, 4))))
        stub, md = admin_pb2_grpc.AdminStub(channel), (("authorization", f"Bearer {TOKEN}"),)
        stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
        stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
        with pytest.raises(grpc.RpcError):
            stub.UnpinExpert(admin_pb2.UnpinExpertRequest(layer=0, expert=0), metadata=md)
        with pytest.raises(grpc.RpcError):
            stub.GetStatus(admin_pb2.GetStatusRequest())
        wait_for(lambda: scrape(port_a).get(("pagedweight_controlplane_telemetry_reports_total", ())) == 1.0)
        got = scrape(port_a)
        assert got[("pagedweight_controlplane_dataplanes_connected", ())] == 1.0
        assert got[("pagedweight_controlplane_plans_sent_total", ())] >= 1.0
        calls = "pagedweight_controlplane_admin_calls_total"
        assert got[(calls, (("code", "OK"), ("method", "GetStatus")))] == 2.0
        assert got[(calls, (("code", "NOT_FOUND"), ("method", "UnpinExpert")))] == 1.0
        assert got[(calls, (("code", "UNAUTHENTICATED"), ("method", "GetStatus")))] == 1.0
        rungs = "pagedweight_controlplane_ladder_rungs"
        assert got[(rungs, (("dataplane_id", "dp-1"), ("direction", "demotion")))] == len(plan.demotions) > 0
        assert got[("pagedweight_controlplane_predicted_quality_cost", (("dataplane_id", "dp-1"),))] == 1.5
        assert got[("pagedweight_controlplane_sensitivity_fallback", (("dataplane_id", "dp-1"),))] == 1.0
        # A second server in the same process counts on its own.
        other_got = scrape(port_b)
        assert other_got[("pagedweight_controlplane_telemetry_reports_total", ())] == 0.0
        assert other_got[("pagedweight_controlplane_dataplanes_registered", ())] == 0.0
    finally:
        dp.close()
        channel.close()
        srv.stop(grace_s=0)
        other.stop(grace_s=0)
    with pytest.raises(OSError):  # stopped with the server
        urllib.request.urlopen(f"http://127.0.0.1:{port_a}/metrics", timeout=2)


def test_metrics_port_zero_serves_nothing(server):
    assert server.metrics_port == 0
