"""Per-block bits of each method of the quality-memory frontier.

* uniform(b): every block at b bits;
* best static that fits a budget: the highest uniform view whose bytes fit;
* planner: controlplane.planner.build_ladder from all-8-bit with
  Constraints(budget_bytes=budget); the bits are the ladder's start bits
  after its first ``budget_rungs`` demotions (what the dataplane walks to
  under the budget) and then the promotions the ladder keeps within the
  budget (they spend the bytes the last demotion freed beyond it). With the
  uniform guard (PlannerConfig.uniform_guard) the budget prefix is the walk
  to the best fitting uniform view when that is predicted cheaper; the
  ladder's budget_anchor says which.

Activity snapshots come from routing measured by the dataplane
(RoutingStats) on a calibration workload, folded into the controlplane's
ActivityTable exactly as telemetry reports are.
"""

from __future__ import annotations

import numpy as np

from controlplane.activity import ActivitySnapshot, ActivityTable
from controlplane.config import PlannerConfig
from controlplane.planner import Constraints, Ladder, ModelShape, PlanInputs, build_ladder
from controlplane.sensitivity import SensitivityTable, fallback_table

CEILING = 8
REPORT_WINDOW_MS = 1000.0  # one simulated telemetry report per second of workload


def uniform_bits(shape: ModelShape, bits: int) -> np.ndarray:
    return np.full((shape.num_layers, shape.num_experts, 3), bits, dtype=np.int64)


def uniform_bytes(shape: ModelShape, bits: int) -> int:
    return shape.expert_bytes(uniform_bits(shape, bits))


def best_static(shape: ModelShape, budget: int) -> int | None:
    """Highest uniform view whose bytes fit ``budget`` (None when none does)."""
    fitting = [b for b in shape.view_bits if uniform_bytes(shape, b) <= budget]
    return max(fitting) if fitting else None


def apply_rungs(bits: np.ndarray, rungs) -> np.ndarray:
    out = bits.copy()
    for r in rungs:
        if out[r.layer, r.expert, r.proj] != r.from_bits:
            raise ValueError(f"rung {r} does not start at the block's bits {out[r.layer, r.expert, r.proj]}")
        out[r.layer, r.expert, r.proj] = r.to_bits
    return out


def planner_bits(shape: ModelShape, table: SensitivityTable, activity: ActivitySnapshot, budget: int,
                 cfg: PlannerConfig) -> np.ndarray:
    """[L, E, 3] bits the planner's ladder gives under ``budget`` (module doc)."""
    return planner_plan(shape, table, activity, budget, cfg)[0]


def planner_plan(shape: ModelShape, table: SensitivityTable, activity: ActivitySnapshot, budget: int,
                 cfg: PlannerConfig) -> tuple[np.ndarray, Ladder]:
    """planner_bits and the ladder they come from."""
    current = uniform_bits(shape, CEILING)
    ladder = build_ladder(PlanInputs(shape, table, activity, current, Constraints(budget_bytes=budget)), cfg)
    if not np.array_equal(ladder.start_bits, current):
        raise ValueError("no floors or pins are set, so the ladder must start at the current bits")
    if not ladder.budget_feasible:
        raise ValueError(f"budget {budget} is below what the ladder can reach")
    fitted = apply_rungs(ladder.start_bits, ladder.demotions[:ladder.budget_rungs])
    bits = apply_rungs(fitted, ladder.promotions[:ladder.corrective_promotions + ladder.budget_promotions])
    assert shape.expert_bytes(bits) <= budget
    return bits, ladder


def no_sensitivity_table(shape: ModelShape, reason: str = "ablation: no sensitivity") -> SensitivityTable:
    """The controlplane's fallback table for this shape (what it uses without a profile)."""
    sizes = tuple(float(shape.bytes_at(p, shape.ceiling_bits)) for p in range(3))
    return fallback_table(shape.num_layers, shape.num_experts, sizes, reason)


def uniform_activity(shape: ModelShape) -> ActivitySnapshot:
    """What the controlplane knows before any telemetry: uniform shares, no demand."""
    table = ActivityTable(shape.num_layers, shape.num_experts, half_life_s=60.0)
    return table.snapshot()


def workload_activity(routed: np.ndarray, prob_mass: np.ndarray, half_life_s: float,
                      reports: int = 1) -> ActivitySnapshot:
    """Activity after a workload with these routing totals ([L, E] each),
    reported as ``reports`` equal windows of REPORT_WINDOW_MS; the running
    demand is the workload's router probability mass (its requests run now)."""
    table = ActivityTable(routed.shape[0], routed.shape[1], half_life_s)
    for _ in range(reports):
        table.update(REPORT_WINDOW_MS, (routed / reports).reshape(-1), (prob_mass / reports).reshape(-1),
                     prob_mass.reshape(-1))
    return table.snapshot()
