"""Telemetry.Connect over real gRPC with fake dataplanes."""

from __future__ import annotations

import queue
import time

import grpc
import numpy as np
import pytest

from controlplane import sensitivity
from controlplane.server import ControlplaneServer
from controlplane.store import Floor
from pagedweight.v1 import admin_pb2, common_pb2, telemetry_pb2
from tests.controlplane.cp_helpers import FakeDataplane, make_config, make_hello, make_report, table_message

L, E = 2, 4
POLL_S = 0.02


def status_of(admin, dataplane_id: str = "dp-1") -> admin_pb2.DataplaneStatus:
    stub, md = admin
    by_id = {d.dataplane_id: d for d in stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md).dataplanes}
    return by_id[dataplane_id]


def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(POLL_S)


def connect(dataplanes, **hello_kwargs) -> tuple[FakeDataplane, telemetry_pb2.PrecisionPlan]:
    dp = dataplanes()
    dp.hello(make_hello(**hello_kwargs))
    welcome = dp.recv()
    assert welcome.WhichOneof("kind") == "welcome" and welcome.welcome.session_id
    return dp, dp.recv_plan()


def test_hello_welcome_plan_and_status(server, admin, dataplanes):
    dp, plan = connect(dataplanes)
    assert plan.plan_id > 0
    cfg = server.cfg.planner
    # The default planner leaves the watermarks to the dataplane (unset, not 0).
    assert cfg.low_watermark is None and cfg.high_watermark is None
    assert not plan.HasField("low_watermark") and not plan.HasField("high_watermark")
    assert plan.min_residence_ms == cfg.min_residence_ms
    assert plan.promotion_bytes_per_s == cfg.promotion_bytes_per_s
    # Before any report every block is assumed at 8 bits: each block walks
    # 8->6->4->3->2 (default floor 2: no host-only rung), and the promotions
    # are the way back up, 2->3->4->6->8.
    assert len(plan.demotions) == L * E * 3 * 4 and len(plan.promotions) == L * E * 3 * 4
    assert all(s.to_bits >= 2 for s in plan.demotions)
    assert all(s.to_bits > s.from_bits for s in plan.promotions)

    bits = np.full((L, E, 3), 8)
    bits[0, 1, :] = 4
    routed = np.array([[10, 0, 5, 5], [1, 2, 3, 4]])
    dp.report(make_report(1, routed, bits, free_pages=7, total_pages=50))
    plan2 = dp.recv_plan()  # the reported bits differ from the plan's basis
    assert plan2.plan_id > plan.plan_id
    # The block at 4 bits climbs 4->6->8 and has its way back up from below.
    assert [(s.from_bits, s.to_bits) for s in plan2.promotions
            if (s.block.layer, s.block.expert, s.block.projection) == (0, 1, common_pb2.PROJECTION_GATE)] == [
        (2, 3), (3, 4), (4, 6), (6, 8)
    ]
    st = status_of(admin)
    assert st.connected and st.model_name == "tiny-moe" and (st.num_layers, st.num_experts) == (L, E)
    assert list(st.block_bits) == bits.reshape(-1).tolist()
    assert (st.free_pages, st.total_pages, st.predicted_quality_cost) == (7, 50, 1.5)
    assert st.engine.running_requests == 1
    assert st.plan_id == plan2.plan_id
    assert st.sensitivity_fallback and st.sensitivity_source.startswith("fallback")
    np.testing.assert_allclose(np.asarray(st.activity).reshape(L, E), routed / routed.sum(1, keepdims=True))
    stub, md = admin
    assert stub.GetPlan(admin_pb2.GetPlanRequest(dataplane_id="dp-1"), metadata=md) == plan2


def test_disconnect_marks_not_connected(server, admin, dataplanes):
    dp, _ = connect(dataplanes)
    assert status_of(admin).connected
    dp.close()
    wait_until(lambda: not status_of(admin).connected)
    # A reconnect with the same id is a new session, connected again.
    connect(dataplanes)
    assert status_of(admin).connected


@pytest.mark.parametrize("first", [
    telemetry_pb2.DataplaneMessage(report=telemetry_pb2.TelemetryReport(sequence=1)),
    telemetry_pb2.DataplaneMessage(hello=make_hello(top_k=0)),
    telemetry_pb2.DataplaneMessage(hello=make_hello(views=(2, 5, 8))),
    telemetry_pb2.DataplaneMessage(),
])
def test_bad_first_message(server, dataplanes, first):
    dp = dataplanes()
    dp._out.put(first)
    with pytest.raises(grpc.RpcError) as info:
        dp.recv()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("report", [
    make_report(1, np.ones((L, E + 1))),  # routed_tokens of the wrong shape
    make_report(1, np.ones((L, E)), block_bits=np.full((L, E, 2), 8)),
    make_report(1, np.ones((L, E)), block_bits=np.full((L, E, 3), 5)),  # 5 bits unsupported
])
def test_bad_report_ends_stream(server, admin, dataplanes, report):
    dp, _ = connect(dataplanes)
    dp.report(report)
    with pytest.raises(grpc.RpcError) as info:
        while True:
            dp.recv()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_until(lambda: not status_of(admin).connected)


def test_second_hello_is_invalid(server, dataplanes):
    dp, _ = connect(dataplanes)
    dp.hello(make_hello())
    with pytest.raises(grpc.RpcError) as info:
        while True:
            dp.recv()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_admin_change_sends_new_plan_within_floor(server, admin, dataplanes):
    dp, plan = connect(dataplanes)
    stub, md = admin
    stub.SetQualityFloor(
        admin_pb2.SetQualityFloorRequest(floor=admin_pb2.QualityFloor(scope=admin_pb2.FloorScope(layer=1),
                                                                       min_bits=6)), metadata=md)
    plan2 = dp.recv_plan()
    assert plan2.plan_id > plan.plan_id
    assert all(s.to_bits >= 6 for s in plan2.demotions if s.block.layer == 1)
    assert any(s.to_bits < 6 for s in plan2.demotions if s.block.layer == 0)
    assert status_of(admin).budget_anchor == "greedy" and status_of(admin).plan_predicted_budget_cost == 0.0
    stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(dataplane_id="dp-1", expert_budget_bytes=10**5),
                         metadata=md)
    assert dp.recv_plan().memory_budget_bytes == 10**5
    st = status_of(admin)
    assert st.budget_anchor == "greedy" or st.budget_anchor.startswith("uniform-")
    assert st.plan_predicted_budget_cost > 0.0


def test_activity_shift_replans_and_stable_activity_does_not(server, dataplanes):
    dp, plan = connect(dataplanes)
    even = np.full((L, E), 10)
    dp.report(make_report(1, even))  # uniform, as assumed: no material shift
    with pytest.raises(queue.Empty):
        dp.recv(timeout=0.5)
    skewed = np.array([[1000, 0, 0, 0], [0, 0, 0, 1000]])
    dp.report(make_report(2, skewed))
    plan2 = dp.recv_plan()
    assert plan2.plan_id > plan.plan_id
    # The hot expert's blocks come later in the demotion order than cold ones.
    order = [(s.block.layer, s.block.expert) for s in plan2.demotions]
    assert order.index((0, 0)) > order.index((0, 1))
    assert order.index((1, 3)) > order.index((1, 0))


def test_the_dataplanes_own_walk_does_not_replan_but_a_block_below_its_floor_does(server, admin, dataplanes):
    dp, plan = connect(dataplanes)
    even = np.full((L, E), 10)
    bits = np.full((L, E, 3), 8)
    bits[1, 1, :] = 6
    dp.report(make_report(1, even, bits))  # the first reported bits differ from the assumption: a plan from them
    first = dp.recv_plan()
    assert first.plan_id > plan.plan_id
    bits[0, 0, :] = 4
    bits[1, 2, 1] = 3
    dp.report(make_report(2, even, bits))  # walked down the plan: it still covers these bits
    with pytest.raises(queue.Empty):
        dp.recv(timeout=0.5)
    stub, md = admin
    stub.SetQualityFloor(admin_pb2.SetQualityFloorRequest(
        floor=admin_pb2.QualityFloor(scope=admin_pb2.FloorScope(layer=1), min_bits=6)), metadata=md)
    floored = dp.recv_plan()
    assert floored.plan_id > first.plan_id and floored.corrective_promotions == 1
    dp.report(make_report(3, even, bits))  # its correction waits for pages: the plan holds it already
    with pytest.raises(queue.Empty):
        dp.recv(timeout=0.5)
    bits[1, 0, 0] = 4  # fell below the floor the plan was made with: correct it
    dp.report(make_report(4, even, bits))
    again = dp.recv_plan()
    assert again.plan_id > floored.plan_id and again.corrective_promotions == 2


def test_plans_are_rate_limited(db_path):
    srv = ControlplaneServer(make_config(db_path, plan_min_interval_s=1.0)).start()
    dp = FakeDataplane(srv.address)
    try:
        dp.hello(make_hello())
        assert dp.recv().WhichOneof("kind") == "welcome"
        first = dp.recv_plan()  # the first plan goes out at once
        for bits in (2, 3, 4, 6, 8):
            srv.store.set_floor(Floor(None, None, bits))
            srv.registry.inputs_changed()
        with pytest.raises(queue.Empty):
            dp.recv(timeout=0.6)
        second = dp.recv_plan(timeout=3.0)  # the burst collapses into one plan
        assert second.plan_id == first.plan_id + 1
        assert all(s.to_bits >= 8 for s in second.demotions)  # the last floor (8) is in force
        with pytest.raises(queue.Empty):
            dp.recv(timeout=1.3)
    finally:
        dp.close()
        srv.stop(grace_s=0)


def sensitive_cost() -> np.ndarray:
    cost = np.zeros((L, E, 3, len(sensitivity.BITS_AXIS)))
    cost[..., 1:] = np.array([5.0, 3.0, 2.0, 1.0, 0.0])  # 2,3,4,6,8 bits
    cost[..., 0] = 5.0
    cost[1, 2, 2, 1:] = [500.0, 300.0, 200.0, 100.0, 0.0]  # one very sensitive block
    return cost


def test_sensitivity_table_from_the_hello_is_used(server, admin, dataplanes):
    dp, plan = connect(dataplanes, table=table_message(sensitive_cost(), source="dp-host:/m/sensitivity.json"))
    st = status_of(admin)
    assert not st.sensitivity_fallback and st.sensitivity_source == "dp-host:/m/sensitivity.json"
    last = plan.demotions[-1]
    assert (last.block.layer, last.block.expert, last.from_bits, last.to_bits) == (1, 2, 3, 2)


def test_no_table_in_the_hello_plans_with_the_fallback(server, admin, dataplanes):
    connect(dataplanes, sensitivity_error="/m/sensitivity.json not found")
    st = status_of(admin)
    assert st.sensitivity_fallback and st.sensitivity_source == "fallback: /m/sensitivity.json not found"


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.cost.pop(), "entries"),
    (lambda t: setattr(t, "num_experts", E + 1), "experts"),
    (lambda t: setattr(t, "num_projections", 2), "num_projections"),
    (lambda t: t.bits.__setitem__(2, 4), "bits"),
    (lambda t: setattr(t, "format_version", 2), "format_version"),
    (lambda t: t.cost.__setitem__(0, float("nan")), "finite"),
])
def test_malformed_table_rejects_the_stream(server, dataplanes, mutate, message):
    table = table_message(sensitive_cost())
    mutate(table)
    dp = dataplanes()
    dp.hello(make_hello(table=table))
    with pytest.raises(grpc.RpcError) as err:
        dp.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()


def test_reconnect_supersedes_the_old_stream(server, admin, dataplanes):
    old, _ = connect(dataplanes)
    new, plan = connect(dataplanes)
    with pytest.raises(StopIteration):  # the old stream ends cleanly (status OK)
        while True:
            old.recv()
    assert status_of(admin).connected
    stub, md = admin
    stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(expert_budget_bytes=12345), metadata=md)
    assert new.recv_plan().memory_budget_bytes == 12345
    assert [d.dataplane_id for d in stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md).dataplanes] == ["dp-1"]
