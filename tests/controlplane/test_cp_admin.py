"""Admin service over real gRPC and a real SQLite file."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.server import ControlplaneServer
from pagedweight.v1 import admin_pb2, admin_pb2_grpc
from tests.controlplane.cp_helpers import TOKEN, make_config, make_hello


def floor_req(bits: int, layer: int | None = None, expert: int | None = None) -> admin_pb2.SetQualityFloorRequest:
    scope = admin_pb2.FloorScope()
    if layer is not None:
        scope.layer = layer
    if expert is not None:
        scope.expert = expert
    return admin_pb2.SetQualityFloorRequest(floor=admin_pb2.QualityFloor(scope=scope, min_bits=bits))


def scopes(reply: admin_pb2.ListQualityFloorsResponse) -> list[tuple]:
    return [
        (f.scope.layer if f.scope.HasField("layer") else None,
         f.scope.expert if f.scope.HasField("expert") else None, f.min_bits)
        for f in reply.floors
    ]


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code()


def test_floors_set_list_replace_clear(admin):
    stub, md = admin
    stub.SetQualityFloor(floor_req(4, layer=1, expert=2), metadata=md)
    stub.SetQualityFloor(floor_req(3), metadata=md)
    stub.SetQualityFloor(floor_req(6, layer=1), metadata=md)
    stub.SetQualityFloor(floor_req(8, layer=1, expert=2), metadata=md)  # replaces the 4
    listed = scopes(stub.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), metadata=md))
    assert listed == [(None, None, 3), (1, None, 6), (1, 2, 8)]
    stub.ClearQualityFloor(admin_pb2.ClearQualityFloorRequest(scope=admin_pb2.FloorScope(layer=1)), metadata=md)
    listed = scopes(stub.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), metadata=md))
    assert listed == [(None, None, 3), (1, 2, 8)]
    missing = admin_pb2.ClearQualityFloorRequest(scope=admin_pb2.FloorScope(layer=1))
    assert code_of(stub.ClearQualityFloor, missing, metadata=md) == grpc.StatusCode.NOT_FOUND


def test_pins_and_budgets(admin, server):
    stub, md = admin
    stub.PinExpert(admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=1, expert=3, bits=4)), metadata=md)
    stub.PinExpert(admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=0, expert=1, bits=0)), metadata=md)
    stub.PinExpert(admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=1, expert=3, bits=8)), metadata=md)
    pins = stub.ListPins(admin_pb2.ListPinsRequest(), metadata=md).pins
    assert [(p.layer, p.expert, p.bits) for p in pins] == [(0, 1, 0), (1, 3, 8)]
    stub.UnpinExpert(admin_pb2.UnpinExpertRequest(layer=0, expert=1), metadata=md)
    assert code_of(stub.UnpinExpert, admin_pb2.UnpinExpertRequest(layer=0, expert=1), metadata=md) == (
        grpc.StatusCode.NOT_FOUND
    )
    stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(dataplane_id="dp-9", expert_budget_bytes=1234), metadata=md)
    stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(expert_budget_bytes=999), metadata=md)
    assert server.store.budget_for("dp-9") == 1234
    assert server.store.budget_for("other") == 999
    stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(dataplane_id="dp-9", expert_budget_bytes=0), metadata=md)
    assert server.store.budget_for("dp-9") == 999
    status = stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
    assert (status.num_floors, status.num_pins) == (0, 1)


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)])
def test_unauthenticated(server, metadata):
    with grpc.insecure_channel(server.address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        assert code_of(stub.ListPins, admin_pb2.ListPinsRequest(), metadata=metadata) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code_of(stub.SetQualityFloor, floor_req(4), metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
    assert server.store.floors() == []


def test_invalid_arguments(admin):
    stub, md = admin
    bad = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.SetQualityFloor, floor_req(5), metadata=md) == bad
    assert code_of(stub.SetQualityFloor, floor_req(16, layer=0), metadata=md) == bad
    assert code_of(stub.SetQualityFloor, floor_req(4, expert=2), metadata=md) == bad
    no_layer = admin_pb2.ClearQualityFloorRequest(scope=admin_pb2.FloorScope(expert=1))
    assert code_of(stub.ClearQualityFloor, no_layer, metadata=md) == bad
    pin = admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=0, expert=0, bits=1))
    assert code_of(stub.PinExpert, pin, metadata=md) == bad
    assert code_of(stub.GetPlan, admin_pb2.GetPlanRequest(dataplane_id="nobody"), metadata=md) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert stub.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), metadata=md).floors == []


def test_out_of_range_for_known_dataplanes(admin, dataplanes):
    stub, md = admin
    stub.SetQualityFloor(floor_req(4, layer=7), metadata=md)  # no dataplane known yet: accepted
    dp = dataplanes()
    dp.hello(make_hello(layers=2, experts=4))
    assert dp.recv().WhichOneof("kind") == "welcome"
    bad = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.SetQualityFloor, floor_req(4, layer=2), metadata=md) == bad
    assert code_of(stub.SetQualityFloor, floor_req(4, layer=1, expert=4), metadata=md) == bad
    pin = admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=0, expert=9, bits=4))
    assert code_of(stub.PinExpert, pin, metadata=md) == bad
    stub.SetQualityFloor(floor_req(4, layer=1, expert=3), metadata=md)
    stub.PinExpert(admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=1, expert=3, bits=6)), metadata=md)


def test_state_survives_restart(db_path):
    first = ControlplaneServer(make_config(db_path)).start()
    md = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(first.address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        stub.SetQualityFloor(floor_req(6, layer=3, expert=1), metadata=md)
        stub.PinExpert(admin_pb2.PinExpertRequest(pin=admin_pb2.Pin(layer=2, expert=0, bits=3)), metadata=md)
        stub.SetMemoryBudget(admin_pb2.SetMemoryBudgetRequest(dataplane_id="a", expert_budget_bytes=77), metadata=md)
    first.stop(grace_s=0)

    second = ControlplaneServer(make_config(db_path)).start()
    try:
        with grpc.insecure_channel(second.address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            floors = stub.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), metadata=md)
            assert scopes(floors) == [(3, 1, 6)]
            pins = stub.ListPins(admin_pb2.ListPinsRequest(), metadata=md).pins
            assert [(p.layer, p.expert, p.bits) for p in pins] == [(2, 0, 3)]
        assert second.store.budget_for("a") == 77
    finally:
        second.stop(grace_s=0)


def test_health_service(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "pagedweight.v1.Telemetry", "pagedweight.v1.Admin"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
