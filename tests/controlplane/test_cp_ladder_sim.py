"""Hysteresis: a plan from the real planner, walked by the dataplane model
(controlplane/ladder_sim.py) under a load oscillating around the low
watermark, causes a bounded number of precision transitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.config import PlannerConfig
from controlplane.convert import ladder_to_plan
from controlplane.ladder_sim import LadderWalker
from controlplane.planner import build_ladder
from controlplane.store import Floor
from tests.controlplane.cp_helpers import PLAN_E as E
from tests.controlplane.cp_helpers import PLAN_L as L
from tests.controlplane.cp_helpers import make_inputs, make_shape

POOL_BYTES = 400_000
STEP_MS = 50
PERIOD_MS = 1000
DURATION_MS = 30_000

# The simulation takes its watermarks from the plan (a dataplane would use its own).
SIM_WATERMARKS = dict(low_watermark=0.05, high_watermark=0.15)


def run(cfg: PlannerConfig, amplitude: int) -> tuple[LadderWalker, list[int]]:
    """Walks a fresh full-precision plan under kv(t) = center + amplitude *
    sin(2 pi t / period), center putting free memory exactly at the low
    watermark. Returns the walker and the transitions count after each step."""
    shape = make_shape()
    bits = np.full((L, E, 3), 8)
    walker = LadderWalker(shape, bits, POOL_BYTES)
    walker.set_plan(ladder_to_plan(build_ladder(make_inputs(current=bits), cfg), plan_id=1, cfg=cfg))
    center = POOL_BYTES - shape.expert_bytes(bits) - cfg.low_watermark * POOL_BYTES
    counts = []
    history = [walker.bits.copy()]
    for t in range(0, DURATION_MS, STEP_MS):
        kv = int(center + amplitude * math.sin(2 * math.pi * t / PERIOD_MS))
        walker.step(t, kv)
        counts.append(walker.stats.transitions)
        history.append(walker.bits.copy())
    walker.history = np.stack(history)  # [steps + 1, L, E, 3]
    return walker, counts


def test_oscillation_inside_the_band_settles():
    cfg = PlannerConfig(low_watermark=0.05, high_watermark=0.15, min_residence_ms=500)
    amplitude = POOL_BYTES // 100  # 1% of the pool, well inside the 10% band
    walker, counts = run(cfg, amplitude)
    # Enough demotions to cover the peak once, then nothing: the smallest
    # rung frees 2 * 1024 bytes, so the peak needs at most this many.
    bound = math.ceil(amplitude / 2048) + 1
    assert 0 < walker.stats.transitions <= bound
    warmup = 2 * PERIOD_MS // STEP_MS
    assert counts[-1] == counts[warmup]
    assert walker.stats.stalls == 0
    assert walker.quality_cost > 0

    # The same load without hysteresis (no band, no residence) thrashes: its
    # transitions keep growing with time. This is what the test guards.
    no_band = PlannerConfig(low_watermark=0.05, high_watermark=0.05, min_residence_ms=0)
    thrash, thrash_counts = run(no_band, amplitude)
    cycles = DURATION_MS // PERIOD_MS
    assert thrash_counts[-1] - thrash_counts[warmup] >= cycles
    assert thrash.stats.transitions > 10 * walker.stats.transitions
    # Every reversal gives back exactly the cost its demotion charged.
    if thrash.stats.demotions == thrash.stats.promotions:
        assert abs(thrash.quality_cost) < 1e-9


def test_min_residence_bounds_transitions_of_a_wide_swing():
    amplitude = POOL_BYTES // 20  # swings wider than the band: the band alone cannot settle it
    fast = PlannerConfig(low_watermark=0.05, high_watermark=0.08, min_residence_ms=0)
    slow = PlannerConfig(low_watermark=0.05, high_watermark=0.08, min_residence_ms=3000)
    fast_walker, _ = run(fast, amplitude)
    slow_walker, _ = run(slow, amplitude)
    assert slow_walker.stats.transitions < fast_walker.stats.transitions / 2
    # A block goes up only min_residence_ms after its last demotion, so it
    # turns from down to up at most once per residence time.
    hist = slow_walker.history  # [steps + 1, L, E, 3]
    reversals = 0
    for idx in zip(*np.nonzero(np.any(hist[1:] != hist[:-1], axis=0))):
        series = hist[(slice(None), *idx)]  # [steps + 1]
        steps = np.nonzero(series[1:] != series[:-1])[0]
        last_down = None
        for cur in steps:
            if series[cur + 1] < series[cur]:
                last_down = cur
            elif last_down is not None:
                assert (cur - last_down) * STEP_MS >= slow.min_residence_ms
                reversals += 1
                last_down = None
    assert reversals <= L * E * 3 * (DURATION_MS // slow.min_residence_ms + 1)


def test_budget_is_enforced_by_the_walker():
    # A greedy budget prefix: the walker stops where it fits.
    cfg = PlannerConfig(uniform_guard=False, **SIM_WATERMARKS)
    shape = make_shape()
    bits = np.full((L, E, 3), 8)
    budget = int(shape.expert_bytes(bits) * 0.7)
    ladder = build_ladder(make_inputs(current=bits, budget=budget), cfg)
    assert ladder.budget_anchor == "greedy"
    walker = LadderWalker(shape, bits, POOL_BYTES)
    walker.set_plan(ladder_to_plan(ladder, plan_id=1, cfg=cfg))
    walker.step(0, kv_bytes=0)  # lots of free memory, but over budget
    assert walker.weight_bytes <= budget
    assert walker.stats.demotions == ladder.budget_rungs and walker.stats.promotions == 0
    walker.step(10_000, kv_bytes=0)  # room stays, the budget still caps promotions
    assert walker.weight_bytes <= budget


def test_floor_above_current_bits_is_corrected_at_once_and_kept():
    shape = make_shape()
    current = np.full((L, E, 3), 2)
    inputs = make_inputs(shape=shape, current=current, floors=(Floor(0, None, 6),))
    cfg = PlannerConfig(min_residence_ms=10_000, **SIM_WATERMARKS)
    ladder = build_ladder(inputs, cfg)
    plan = ladder_to_plan(ladder, 1, cfg)
    assert plan.corrective_promotions == E * 3 and list(plan.floor_bits) == ladder.floor_bits.reshape(-1).tolist()
    weights = shape.expert_bytes(current)
    corrective_bytes = shape.expert_bytes(ladder.start_bits) - weights
    # Free memory: enough for the corrections, far under the high watermark.
    pool = weights + corrective_bytes + 1000
    walker = LadderWalker(shape, current, pool)
    walker.set_plan(plan)
    walker.step(now_ms=0.0, kv_bytes=0)
    assert np.all(walker.bits[0] == 6) and np.all(walker.bits[1] == 2)
    walker.step(now_ms=50_000.0, kv_bytes=pool)  # all memory wanted by KV: demote everything allowed
    assert np.all(walker.bits[0] == 6)


def test_a_plan_without_watermarks_is_refused_by_the_simulation():
    cfg = PlannerConfig()  # the default leaves the watermarks to the dataplane
    plan = ladder_to_plan(build_ladder(make_inputs(), cfg), plan_id=1, cfg=cfg)
    assert not plan.HasField("low_watermark") and not plan.HasField("high_watermark")
    walker = LadderWalker(make_shape(), np.full((L, E, 3), 8), POOL_BYTES)
    with pytest.raises(ValueError, match="low_watermark, high_watermark"):
        walker.set_plan(plan)
    set_cfg = PlannerConfig(low_watermark=0.02, high_watermark=0.06)
    plan = ladder_to_plan(build_ladder(make_inputs(), set_cfg), plan_id=2, cfg=set_cfg)
    assert (plan.low_watermark, plan.high_watermark) == (0.02, 0.06)
    walker.set_plan(plan)
