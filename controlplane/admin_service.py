"""gRPC Admin service: quality floors, pins, memory budgets, plans, status.

Authentication happens before these handlers (controlplane/auth.py). Errors:
INVALID_ARGUMENT for bits outside {0, 2, 3, 4, 6, 8}, an expert without a
layer, or a layer/expert that no registered dataplane has (unchecked while
none is registered); NOT_FOUND for clearing a missing floor/pin and for
GetPlan of an unknown dataplane (or one that has no plan yet). Every change is
persisted first (controlplane/store.py), then the affected dataplanes are
re-planned.
"""

from __future__ import annotations

import grpc

from controlplane.config import ALLOWED_BITS
from controlplane.registry import DataplaneRegistry
from controlplane.store import AdminStore, Floor, Pin
from pagedweight.v1 import admin_pb2, admin_pb2_grpc, telemetry_pb2

MAX_DATAPLANE_ID_LEN = 256


class AdminService(admin_pb2_grpc.AdminServicer):
    """Serves the Admin RPCs over an AdminStore and a DataplaneRegistry."""

    def __init__(self, store: AdminStore, registry: DataplaneRegistry) -> None:
        self._store = store
        self._registry = registry

    # -- validation ------------------------------------------------------------
    def _check_bits(self, bits: int, context: grpc.ServicerContext) -> None:
        if bits not in ALLOWED_BITS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bits must be one of {list(ALLOWED_BITS)}, got {bits}")

    def _check_range(self, layer: int | None, expert: int | None, context: grpc.ServicerContext) -> None:
        """A scope must exist in at least one registered dataplane's model."""
        shapes = self._registry.shapes()
        if not shapes or layer is None:
            return
        if not any(layer < s.num_layers and (expert is None or expert < s.num_experts) for s in shapes):
            sizes = sorted({(s.num_layers, s.num_experts) for s in shapes})
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"layer {layer}" + ("" if expert is None else f" expert {expert}")
                + f" is out of range of every registered dataplane (layers, experts): {sizes}",
            )

    def _scope(self, scope: admin_pb2.FloorScope, context: grpc.ServicerContext) -> tuple[int | None, int | None]:
        layer = scope.layer if scope.HasField("layer") else None
        expert = scope.expert if scope.HasField("expert") else None
        if expert is not None and layer is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an expert scope needs a layer")
        return layer, expert

    # -- floors ----------------------------------------------------------------
    def SetQualityFloor(self, request: admin_pb2.SetQualityFloorRequest, context) -> admin_pb2.QualityFloor:
        layer, expert = self._scope(request.floor.scope, context)
        self._check_bits(request.floor.min_bits, context)
        self._check_range(layer, expert, context)
        self._store.set_floor(Floor(layer, expert, request.floor.min_bits))
        self._registry.inputs_changed()
        return request.floor

    def ClearQualityFloor(self, request: admin_pb2.ClearQualityFloorRequest, context):
        layer, expert = self._scope(request.scope, context)
        if not self._store.clear_floor(layer, expert):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no floor for scope {_scope_text(layer, expert)}")
        self._registry.inputs_changed()
        return admin_pb2.ClearQualityFloorResponse()

    def ListQualityFloors(self, request, context) -> admin_pb2.ListQualityFloorsResponse:
        return admin_pb2.ListQualityFloorsResponse(floors=[floor_to_proto(f) for f in self._store.floors()])

    # -- pins --------------------------------------------------------------------
    def PinExpert(self, request: admin_pb2.PinExpertRequest, context) -> admin_pb2.Pin:
        pin = request.pin
        self._check_bits(pin.bits, context)
        self._check_range(pin.layer, pin.expert, context)
        self._store.set_pin(Pin(pin.layer, pin.expert, pin.bits))
        self._registry.inputs_changed()
        return pin

    def UnpinExpert(self, request: admin_pb2.UnpinExpertRequest, context) -> admin_pb2.UnpinExpertResponse:
        if not self._store.clear_pin(request.layer, request.expert):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no pin for layer {request.layer} expert {request.expert}")
        self._registry.inputs_changed()
        return admin_pb2.UnpinExpertResponse()

    def ListPins(self, request, context) -> admin_pb2.ListPinsResponse:
        return admin_pb2.ListPinsResponse(
            pins=[admin_pb2.Pin(layer=p.layer, expert=p.expert, bits=p.bits) for p in self._store.pins()]
        )

    # -- budgets, plans, status ------------------------------------------------
    def SetMemoryBudget(self, request: admin_pb2.SetMemoryBudgetRequest, context):
        if len(request.dataplane_id) > MAX_DATAPLANE_ID_LEN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"dataplane_id longer than {MAX_DATAPLANE_ID_LEN}")
        self._store.set_budget(request.dataplane_id, request.expert_budget_bytes)
        self._registry.inputs_changed(request.dataplane_id)
        return admin_pb2.SetMemoryBudgetResponse()

    def GetPlan(self, request: admin_pb2.GetPlanRequest, context) -> telemetry_pb2.PrecisionPlan:
        try:
            return self._registry.get_plan(request.dataplane_id)
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))

    def GetStatus(self, request, context) -> admin_pb2.StatusResponse:
        return admin_pb2.StatusResponse(
            dataplanes=self._registry.statuses(),
            num_floors=len(self._store.floors()),
            num_pins=len(self._store.pins()),
        )


def floor_to_proto(floor: Floor) -> admin_pb2.QualityFloor:
    scope = admin_pb2.FloorScope()
    if floor.layer is not None:
        scope.layer = floor.layer
    if floor.expert is not None:
        scope.expert = floor.expert
    return admin_pb2.QualityFloor(scope=scope, min_bits=floor.min_bits)


def _scope_text(layer: int | None, expert: int | None) -> str:
    if layer is None:
        return "model"
    return f"layer {layer}" if expert is None else f"layer {layer} expert {expert}"
