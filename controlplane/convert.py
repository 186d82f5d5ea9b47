"""Conversions between the Telemetry protobuf messages and the planner's
types, with the validation of what the dataplane sends. Every validator
raises ValueError with a message fit for an INVALID_ARGUMENT status."""

from __future__ import annotations

import numpy as np

from controlplane import sensitivity
from controlplane.config import PlannerConfig
from controlplane.planner import HOST_ONLY, NUM_PROJECTIONS, Ladder, ModelShape, Rung
from pagedweight.v1 import common_pb2, telemetry_pb2

# WEIGHT_LAYOUT.md VIEW_BITS: the views a weight store may support.
VIEW_BITS = (2, 3, 4, 6, 8)
MAX_DATAPLANE_ID_LEN = 256
# Projection enum -> block index order (gate, up, down) of WEIGHT_LAYOUT.md.
PROJ_INDEX = {common_pb2.PROJECTION_GATE: 0, common_pb2.PROJECTION_UP: 1, common_pb2.PROJECTION_DOWN: 2}
PROJ_ENUM = {index: enum for enum, index in PROJ_INDEX.items()}


def shape_from_hello(hello: telemetry_pb2.Hello) -> ModelShape:
    """Validates a Hello and returns the model shape it announces (its
    sensitivity table is checked by table_for_hello)."""
    if not hello.dataplane_id or len(hello.dataplane_id) > MAX_DATAPLANE_ID_LEN:
        raise ValueError(f"dataplane_id must be 1..{MAX_DATAPLANE_ID_LEN} characters")
    if hello.num_layers < 1 or hello.num_experts < 1:
        raise ValueError("num_layers and num_experts must be >= 1")
    if not 1 <= hello.top_k <= hello.num_experts:
        raise ValueError(f"top_k must be in 1..num_experts ({hello.num_experts}), got {hello.top_k}")
    bits = tuple(hello.supported_bits)
    if not bits or any(b not in VIEW_BITS for b in bits) or list(bits) != sorted(set(bits)):
        raise ValueError(f"supported_bits must be ascending, distinct, from {VIEW_BITS}; got {list(bits)}")
    footprints: list[dict[int, int] | None] = [None] * NUM_PROJECTIONS
    for fp in hello.footprints:
        proj = PROJ_INDEX.get(fp.projection)
        if proj is None:
            raise ValueError(f"footprint with invalid projection {fp.projection}")
        if footprints[proj] is not None:
            raise ValueError(f"duplicate footprint of projection {fp.projection}")
        by_bits = {e.bits: e.bytes for e in fp.by_bits}
        if len(by_bits) != len(fp.by_bits) or set(by_bits) != {HOST_ONLY, *bits}:
            raise ValueError(
                f"footprint of projection {fp.projection} must list each of {sorted({HOST_ONLY, *bits})} once"
            )
        if by_bits[HOST_ONLY] != 0:
            raise ValueError("a host-only footprint must be 0 bytes")
        sizes = [by_bits[b] for b in bits]
        if sizes[0] <= 0 or any(b < a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"footprint bytes of projection {fp.projection} must be > 0 and grow with bits")
        footprints[proj] = by_bits
    if any(fp is None for fp in footprints):
        raise ValueError("footprints must cover gate, up and down")
    return ModelShape(
        num_layers=hello.num_layers,
        num_experts=hello.num_experts,
        top_k=hello.top_k,
        view_bits=bits,
        footprint_bytes=tuple(footprints),  # type: ignore[arg-type]
    )


def block_bits_from_report(report: telemetry_pb2.TelemetryReport, shape: ModelShape) -> np.ndarray | None:
    """[L, E, 3] bits of the report, or None when it carries none."""
    if len(report.block_bits) == 0:
        return None
    expected = shape.num_layers * shape.num_experts * NUM_PROJECTIONS
    if len(report.block_bits) != expected:
        raise ValueError(f"block_bits has {len(report.block_bits)} entries, expected {expected}")
    bits = np.asarray(report.block_bits, dtype=np.int64)
    allowed = np.asarray((HOST_ONLY, *shape.view_bits))
    if not np.all(np.isin(bits, allowed)):
        raise ValueError(f"block_bits values must be in {allowed.tolist()}")
    return bits.reshape(shape.num_layers, shape.num_experts, NUM_PROJECTIONS)


def full_precision_bits(shape: ModelShape) -> np.ndarray:
    """[L, E, 3] every block at the ceiling: the assumed state before the
    first report."""
    return np.full((shape.num_layers, shape.num_experts, NUM_PROJECTIONS), shape.ceiling_bits, dtype=np.int64)


def rung_to_step(rung: Rung) -> telemetry_pb2.PrecisionStep:
    return telemetry_pb2.PrecisionStep(
        block=common_pb2.BlockId(layer=rung.layer, expert=rung.expert, projection=PROJ_ENUM[rung.proj]),
        from_bits=rung.from_bits,
        to_bits=rung.to_bits,
        bytes_delta=rung.bytes_delta,
        quality_delta=rung.quality_delta,
    )


def step_to_rung(step: telemetry_pb2.PrecisionStep) -> Rung:
    return Rung(
        layer=step.block.layer,
        expert=step.block.expert,
        proj=PROJ_INDEX[step.block.projection],
        from_bits=step.from_bits,
        to_bits=step.to_bits,
        bytes_delta=step.bytes_delta,
        quality_delta=step.quality_delta,
    )


def ladder_to_plan(ladder: Ladder, plan_id: int, cfg: PlannerConfig) -> telemetry_pb2.PrecisionPlan:
    """The PrecisionPlan message of a ladder, with the hysteresis parameters
    copied from the planner config (watermarks it leaves None stay unset: the
    dataplane's own apply)."""
    return telemetry_pb2.PrecisionPlan(
        corrective_promotions=ladder.corrective_promotions,
        corrective_demotions=ladder.corrective_demotions,
        floor_bits=ladder.floor_bits.reshape(-1).tolist(),
        plan_id=plan_id,
        demotions=[rung_to_step(r) for r in ladder.demotions],
        promotions=[rung_to_step(r) for r in ladder.promotions],
        low_watermark=cfg.low_watermark,
        high_watermark=cfg.high_watermark,
        min_residence_ms=cfg.min_residence_ms,
        promotion_bytes_per_s=cfg.promotion_bytes_per_s,
        memory_budget_bytes=ladder.budget_bytes,
    )


def table_from_proto(msg: telemetry_pb2.SensitivityTable, shape: ModelShape) -> sensitivity.SensitivityTable:
    """Validates a Hello's table against the announced shape; ValueError
    (a SensitivityError) when it is malformed."""
    if msg.format_version != sensitivity.FORMAT_VERSION:
        raise sensitivity.SensitivityError(
            f"sensitivity format_version {msg.format_version} unsupported (expected {sensitivity.FORMAT_VERSION})"
        )
    if list(msg.bits) != list(sensitivity.BITS_AXIS):
        raise sensitivity.SensitivityError(
            f"sensitivity bits must be {list(sensitivity.BITS_AXIS)}, got {list(msg.bits)}"
        )
    if msg.num_projections != len(sensitivity.PROJECTIONS):
        raise sensitivity.SensitivityError(f"sensitivity num_projections must be {len(sensitivity.PROJECTIONS)}")
    if (msg.num_layers, msg.num_experts) != (shape.num_layers, shape.num_experts):
        raise sensitivity.SensitivityError(
            f"sensitivity table is {msg.num_layers} layers x {msg.num_experts} experts, "
            f"the Hello announces {shape.num_layers} x {shape.num_experts}"
        )
    dims = (msg.num_layers, msg.num_experts, msg.num_projections, len(msg.bits))
    if len(msg.cost) != int(np.prod(dims)):
        raise sensitivity.SensitivityError(f"sensitivity cost has {len(msg.cost)} entries, dimensions {list(dims)} "
                                           f"need {int(np.prod(dims))}")
    cost = np.asarray(msg.cost, dtype=np.float64).reshape(dims)  # [L, E, 3, bits]
    sensitivity.validate_cost(cost, shape.num_layers, shape.num_experts)
    return sensitivity.SensitivityTable(cost=cost, source=msg.source or "dataplane Hello", is_fallback=False)


def table_for_hello(hello: telemetry_pb2.Hello, shape: ModelShape) -> sensitivity.SensitivityTable:
    """The Hello's table, or the fallback when it carries none (never reads
    a file). ValueError when the table it carries is malformed."""
    if hello.HasField("sensitivity"):
        return table_from_proto(hello.sensitivity, shape)
    sizes = tuple(float(shape.bytes_at(p, shape.ceiling_bits)) for p in range(NUM_PROJECTIONS))
    reason = hello.sensitivity_error or "the dataplane sent no sensitivity table"
    return sensitivity.fallback_table(shape.num_layers, shape.num_experts, sizes, reason)  # type: ignore[arg-type]
