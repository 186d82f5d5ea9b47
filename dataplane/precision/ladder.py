"""The ladder the dataplane walks: plan steps in engine-friendly form.

A ``Ladder`` is the dataplane's copy of the controlplane's PrecisionPlan (or
of its local fallback when no plan ever arrived): demotion rungs cheapest
quality per byte first, promotion rungs most quality per byte first, plus the
watermarks and anti-thrashing limits. Pure data; no store access here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedweight.v1 import common_pb2, telemetry_pb2

# Derived watermarks (step_watermarks): the high one is this many times the
# low one (the band is the hysteresis, as in the old fixed 5 % / 15 %), and
# neither goes past those old fixed values, so a small arena, where one step's
# KV is a large share, keeps them.
WATERMARK_BAND_RATIO = 3.0
MAX_DERIVED_LOW_WATERMARK = 0.05
MAX_DERIVED_HIGH_WATERMARK = 0.15

# Projection enum of common.proto -> block-index projection (gate, up, down).
_PROJ_OF_ENUM = {
    common_pb2.PROJECTION_GATE: 0,
    common_pb2.PROJECTION_UP: 1,
    common_pb2.PROJECTION_DOWN: 2,
}


@dataclass(frozen=True)
class Rung:
    """Move one block from ``from_bits`` to ``to_bits`` (0 = host-only)."""

    block: int
    from_bits: int
    to_bits: int
    quality_delta: float  # cost (demotion) or benefit (promotion), >= 0


@dataclass(frozen=True)
class WalkLimits:
    """When to walk, and how fast."""

    low_watermark: float  # demote while free pages / total < this
    high_watermark: float  # promote only while free pages / total stays > this
    min_residence_s: float  # a demoted block is not promoted again for this long
    promotion_bytes_per_s: int  # 0 = unlimited

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_watermark <= self.high_watermark < 1.0:
            raise ValueError(
                f"watermarks must satisfy 0 <= low <= high < 1, got {self.low_watermark}, {self.high_watermark}"
            )
        if self.min_residence_s < 0 or self.promotion_bytes_per_s < 0:
            raise ValueError("residence and promotion rate must be >= 0")


def step_watermarks(step_kv_pages: int, total_pages: int) -> tuple[float, float]:
    """(low, high) watermarks from the KV pages one engine step can take.

    Demoting ahead of demand only has to keep one step's worth of pages free:
    the scheduler reclaims on demand (``PrecisionController.reclaim``) for
    anything past that, before it would preempt. A fixed share of the arena
    does not scale: 15 % of a ~48 GB Mixtral-8x7B arena is ~7 GB held free,
    i.e. experts demoted for KV that never comes. ``step_kv_pages`` is the
    engine's worst case (engine_builder: every running sequence starting a
    block plus the step's token budget in whole blocks).
    """
    if total_pages <= 0:
        raise ValueError(f"total_pages must be > 0, got {total_pages}")
    low = min(MAX_DERIVED_LOW_WATERMARK, max(0, step_kv_pages) / total_pages)
    return low, min(MAX_DERIVED_HIGH_WATERMARK, WATERMARK_BAND_RATIO * low)


@dataclass(frozen=True)
class Ladder:
    """Demotions and promotions in the order to apply them, and the limits.

    corrective_* are the plan's leading corrective rungs (pins and floors the
    blocks do not meet yet; telemetry.proto PrecisionPlan): the controller
    applies them without waiting for pressure or room. ``demotions`` still
    starts with the corrective demotions; ``promotions`` excludes the
    corrective promotions. floor_bits: minimum bits per block index, or None.
    """

    plan_id: int
    demotions: tuple[Rung, ...]
    promotions: tuple[Rung, ...]
    limits: WalkLimits
    corrective_demotions: tuple[Rung, ...] = ()
    corrective_promotions: tuple[Rung, ...] = ()
    floor_bits: tuple[int, ...] | None = None


def ladder_from_plan(plan: telemetry_pb2.PrecisionPlan, num_experts: int, defaults: WalkLimits) -> Ladder:
    """Converts a PrecisionPlan; walk limits the plan leaves unset fall back to ``defaults``.
    The controller checks floor_bits against its block count."""

    def rung(step: telemetry_pb2.PrecisionStep) -> Rung:
        proj = _PROJ_OF_ENUM.get(step.block.projection)
        if proj is None:
            raise ValueError(f"plan step with unknown projection {step.block.projection}")
        block = (step.block.layer * num_experts + step.block.expert) * 3 + proj
        return Rung(block, step.from_bits, step.to_bits, abs(step.quality_delta))

    def limit(field: str, default):
        return getattr(plan, field) if plan.HasField(field) else default

    low = limit("low_watermark", defaults.low_watermark)
    limits = WalkLimits(
        low_watermark=low,
        high_watermark=max(limit("high_watermark", defaults.high_watermark), low),
        min_residence_s=limit("min_residence_ms", defaults.min_residence_s * 1000.0) / 1000.0,
        promotion_bytes_per_s=limit("promotion_bytes_per_s", defaults.promotion_bytes_per_s),
    )
    demotions = tuple(rung(s) for s in plan.demotions)
    promotions = tuple(rung(s) for s in plan.promotions)
    n_down = min(plan.corrective_demotions, len(demotions))
    n_up = min(plan.corrective_promotions, len(promotions))
    floors = tuple(plan.floor_bits) if len(plan.floor_bits) else None
    return Ladder(
        plan_id=plan.plan_id,
        demotions=demotions,
        promotions=promotions[n_up:],
        limits=limits,
        corrective_demotions=demotions[:n_down],
        corrective_promotions=promotions[:n_up],
        floor_bits=floors,
    )
