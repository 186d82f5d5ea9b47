"""The host-only rung's price (in the table's units) and the uniform budget guard."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from controlplane.activity import ActivitySnapshot, normalize_rows
from controlplane.budget_guard import uniform_level
from controlplane.config import PlannerConfig
from controlplane.planner import (
    Constraints,
    ModelShape,
    PlanInputs,
    RungCost,
    apply_rungs,
    build_ladder,
)
from controlplane.sensitivity import BITS_AXIS, SensitivityTable, load
from controlplane.store import Floor, Pin

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny" / "sensitivity.json"
# The default model's block bytes per view (PAGE_BYTES 1024 pages, as the frontier measures them).
TINY_FOOTPRINT = {0: 0, 2: 27648, 3: 43008, 4: 58368, 6: 86016, 8: 113664}
VIEWS = (2, 3, 4, 6, 8)
COLD, HOT = 0, 1
# The tests below fix the per-use price of session 53 (a 0.33 ms fetch, 25 GB/s)
# so that host_stall_weight alone sets how dear a stall is: CHEAP_STALL, the
# price before session 53 measured the default model's step (18.9 -> 0.67 ms)
# and fetch (0.28 -> 0.33 ms); 1.0, that fetch at the measured step.
FETCH_PRICE = dict(host_read_latency_s=3.3e-4, host_bandwidth_bytes_per_s=25e9)
CHEAP_STALL = 0.03


def at_fetch_price(weight: float, **kw) -> PlannerConfig:
    """PlannerConfig at FETCH_PRICE and this host_stall_weight."""
    return PlannerConfig(host_stall_weight=weight, **FETCH_PRICE, **kw)


EAGER_STEP_S = 9e-3  # session 53's price of a step run eagerly (host-only blocks then forced it)

def snapshot(share: np.ndarray) -> ActivitySnapshot:
    rows = normalize_rows(share)
    return ActivitySnapshot(rows, rows, rows, has_demand=False)


def skewed_share(layers: int, experts: int, cold: float, hot: float) -> np.ndarray:
    """[L, E]: expert COLD gets ``cold`` of each layer, HOT gets ``hot``, the rest share evenly."""
    share = np.full((layers, experts), (1.0 - cold - hot) / (experts - 2))
    share[:, COLD], share[:, HOT] = cold, hot
    return share


def tiny_inputs(share: np.ndarray, table: SensitivityTable, floors=(Floor(None, None, 0),), budget=0) -> PlanInputs:
    shape = ModelShape(table.num_layers, table.num_experts, 2, VIEWS, (TINY_FOOTPRINT,) * 3)
    current = np.full((shape.num_layers, shape.num_experts, 3), 8)
    return PlanInputs(shape, table, snapshot(share), current, Constraints(floors=tuple(floors), budget_bytes=budget))


@pytest.fixture(scope="module")
def tiny_table() -> SensitivityTable:
    return load(DEFAULT_TABLE)


def positions(ladder, expert: int, pred) -> list[int]:
    return [i for i, r in enumerate(ladder.demotions) if r.expert == expert and pred(r)]


def test_rare_expert_goes_host_only_before_a_hot_one_loses_real_bits(tiny_table):
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.005, hot=0.3)
    ladder = build_ladder(tiny_inputs(share, tiny_table), at_fetch_price(CHEAP_STALL))
    cold_host = positions(ladder, COLD, lambda r: r.to_bits == 0)
    hot_below_6 = positions(ladder, HOT, lambda r: r.from_bits == 6)
    hot_host = positions(ladder, HOT, lambda r: r.to_bits == 0)
    assert len(cold_host) == len(hot_host) == 3 * tiny_table.num_layers
    assert max(cold_host) < min(hot_below_6)  # the rare expert leaves the GPU before the hot one drops to 4 bits
    assert max(cold_host) < min(hot_host)
    for layer in range(tiny_table.num_layers):
        for proj in range(3):
            for expert in (COLD, HOT):
                # The host-only rung is a block's last; its chain skips the views host-only beats
                # (RungCost.convex_path), and each step costs more per byte than the one before.
                mine = [r for r in ladder.demotions if (r.layer, r.expert, r.proj) == (layer, expert, proj)]
                assert mine[0].from_bits == 8 and mine[-1].to_bits == 0
                assert all(a.to_bits == b.from_bits for a, b in zip(mine, mine[1:]))
                ratios = [r.quality_delta / r.bytes_delta for r in mine]
                assert ratios == sorted(ratios)


def old_profile(table: SensitivityTable) -> SensitivityTable:
    """The table as profiles before session 53 wrote it: sens(0) = sens(2) (a
    fetched block then stayed at the lowest view)."""
    return SensitivityTable(np.concatenate([table.cost[..., 1:2], table.cost[..., 1:]], axis=-1), "old", False)


def test_host_only_rung_priced_in_table_units_and_linear_in_route_probability(tiny_table):
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.01, hot=0.3)
    cfg = PlannerConfig()
    old = old_profile(tiny_table)
    cost = RungCost(tiny_inputs(share, old), cfg)
    # sens(0) == sens(2) in this table, so the 2 -> 0 rung is the stall alone.
    host_cold = cost.rung(0, COLD, 0, 2, 0).quality_delta
    host_hot = cost.rung(0, HOT, 0, 2, 0).quality_delta
    # route_prob = top_k * share: 0.02 vs 0.6.
    assert host_hot / host_cold == pytest.approx(0.6 / 0.02)
    lowest = BITS_AXIS.index(VIEWS[0])
    worst = old.cost[..., lowest].sum()
    # Each use reads the master view in place from the host.
    fetch_s = cfg.host_read_latency_s + TINY_FOOTPRINT[8] / cfg.host_bandwidth_bytes_per_s
    assert host_hot == pytest.approx(cfg.host_stall_weight * worst / cfg.reference_step_s * 0.6 * fetch_s)
    # Same table in other units (x1000): the host-only rung scales with it, so
    # its place among demotions does not depend on the units.
    scaled = SensitivityTable(old.cost * 1000.0, "scaled", False)
    scaled_cost = RungCost(tiny_inputs(share, scaled), cfg)
    assert scaled_cost.rung(0, HOT, 0, 2, 0).quality_delta == pytest.approx(1000.0 * host_hot)
    a = build_ladder(tiny_inputs(share, old), cfg).demotions
    b = build_ladder(tiny_inputs(share, scaled), cfg).demotions
    assert [(r.layer, r.expert, r.proj, r.to_bits) for r in a] == [(r.layer, r.expert, r.proj, r.to_bits) for r in b]


def test_a_batch_reads_a_host_only_block_if_any_of_its_tokens_routes_to_it(tiny_table):
    """host_price_batch B prices a step's read chance 1 - (1 - p)^B (p the
    per-token route probability); 0 takes B from the running sequences."""
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.01, hot=0.3)
    inputs = tiny_inputs(share, old_profile(tiny_table))  # sens(0) == sens(2): the 2 -> 0 rung is the stall
    one = RungCost(inputs, at_fetch_price(1.0, host_price_batch=1))
    batch = RungCost(inputs, at_fetch_price(1.0, host_price_batch=16))
    for expert, p in ((COLD, 0.02), (HOT, 0.6)):
        ratio = batch.rung(0, expert, 0, 2, 0).quality_delta / one.rung(0, expert, 0, 2, 0).quality_delta
        assert ratio == pytest.approx((1 - (1 - p) ** 16) / p)
    assert RungCost(inputs, at_fetch_price(1.0)).price_batch == 1  # nothing running: one sequence
    running = PlanInputs(inputs.shape, inputs.sensitivity, replace(inputs.activity, running_seqs=7.4),
                         inputs.current_bits, inputs.constraints)
    live = RungCost(running, at_fetch_price(1.0))
    assert live.price_batch == 7
    assert live.rung(0, HOT, 0, 2, 0).quality_delta == pytest.approx(
        RungCost(inputs, at_fetch_price(1.0, host_price_batch=7)).rung(0, HOT, 0, 2, 0).quality_delta)


def test_host_only_at_the_master_view_trades_the_lowest_views_loss_for_the_stall(tiny_table):
    """A current profile's sens(0) is the 8-bit cost (0): the 2 -> 0 rung costs the
    stall minus the lowest view's loss, clipped at 0, the same both ways."""
    assert np.all(tiny_table.cost[..., BITS_AXIS.index(0)] == 0.0)
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.01, hot=0.3)
    priced = {}
    for weight in (CHEAP_STALL, 1.0):
        cfg = at_fetch_price(weight)
        cost = RungCost(tiny_inputs(share, tiny_table), cfg)
        stall_cost = RungCost(tiny_inputs(share, old_profile(tiny_table)), cfg)  # the stall alone (test above)
        for expert in (COLD, HOT):
            stall = stall_cost.rung(0, expert, 0, 2, 0).quality_delta
            loss = float(cost.importance[0, expert]) * tiny_table.at(0, expert, 0, 2)
            down, up = cost.rung(0, expert, 0, 2, 0), cost.rung(0, expert, 0, 0, 2)
            assert down.quality_delta == up.quality_delta == pytest.approx(max(0.0, stall - loss))
            assert down.bytes_delta == -up.bytes_delta == TINY_FOOTPRINT[2]
            priced[weight, expert] = down.quality_delta
    # At a cheap price leaving the lowest view for the host gains more than the
    # stall costs, for the rare and the hot expert; at session 53's fetch the
    # stall outweighs both gains.
    assert priced[CHEAP_STALL, COLD] == priced[CHEAP_STALL, HOT] == 0.0
    assert 0.0 < priced[1.0, COLD] < priced[1.0, HOT]
    # A state's cost counts a host-only block's stall and no table loss.
    bits = np.full((tiny_table.num_layers, tiny_table.num_experts, 3), 8)
    bits[0, HOT, 0] = 0
    assert cost.state_cost(bits) == pytest.approx(stall_cost.rung(0, HOT, 0, 2, 0).quality_delta)


def test_free_stalls_send_blocks_to_the_host_in_one_step(tiny_table):
    """A free stall makes host-only (the master view's quality, no bytes) every
    block's best state: each goes there from the ceiling in one free step."""
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.01, hot=0.3)
    ladder = build_ladder(tiny_inputs(share, tiny_table), PlannerConfig(host_stall_weight=0.0))
    blocks = tiny_table.num_layers * tiny_table.num_experts * 3
    assert [(r.from_bits, r.to_bits, r.quality_delta) for r in ladder.demotions] == [(8, 0, 0.0)] * blocks


# -- the uniform guard ---------------------------------------------------------------

def nonconvex_table() -> SensitivityTable:
    """1 layer, 2 experts (same for the 3 projections). Expert 0: 8->6 costly,
    6->4 almost free; expert 1: cheap steps all the way down. The greedy walk
    takes expert 1 to 2 bits before it pays expert 0's 8->6."""
    views = {0: [110.0, 100.01, 10.01, 10.0, 0.0], 1: [9.0, 7.0, 5.0, 1.0, 0.0]}  # cost at 2, 3, 4, 6, 8
    cost = np.zeros((1, 2, 3, len(BITS_AXIS)))
    for e, c in views.items():
        cost[0, e, :, 1:] = c
        cost[0, e, :, 0] = c[0]
    return SensitivityTable(cost, "nonconvex", False)


def flat_inputs(table: SensitivityTable, budget: int, floors=(), pins=()) -> PlanInputs:
    per_bit = {0: 0, **{b: 100 * b for b in VIEWS}}
    shape = ModelShape(1, 2, 1, VIEWS, (per_bit,) * 3)
    return PlanInputs(shape, table, snapshot(np.ones((1, 2))), np.full((1, 2, 3), 8),
                      Constraints(floors=tuple(floors), pins=tuple(pins), budget_bytes=budget))


def budget_state(ladder) -> np.ndarray:
    fitted = apply_rungs(ladder.start_bits, ladder.demotions[:ladder.budget_rungs])
    return apply_rungs(fitted, ladder.promotions[:ladder.budget_promotions])


def test_guard_keeps_the_uniform_state_when_greedy_is_predicted_worse():
    inputs = flat_inputs(nonconvex_table(), budget=2 * 3 * 400)  # uniform 4-bit bytes
    greedy = build_ladder(inputs, PlannerConfig(uniform_guard=False))
    guarded = build_ladder(inputs, PlannerConfig())
    assert greedy.budget_anchor == "greedy" and guarded.budget_anchor == "uniform-4"
    cost = RungCost(inputs, PlannerConfig())
    weight = 1.0 + PlannerConfig().importance_floor  # importance of an evenly routed expert
    uniform4 = np.full((1, 2, 3), 4)
    # Greedy: expert 1 all the way to 2 bits, then expert 0's projections 4, 6, 8.
    np.testing.assert_array_equal(budget_state(greedy)[0], [[4, 6, 8], [2, 2, 2]])
    assert cost.state_cost(budget_state(greedy)) == pytest.approx(weight * (10.01 + 10.0 + 3 * 9.0))
    assert cost.state_cost(uniform4) == pytest.approx(weight * 3 * (10.01 + 5.0))
    np.testing.assert_array_equal(budget_state(guarded), uniform4)
    assert guarded.predicted_budget_cost == pytest.approx(cost.state_cost(uniform4))
    assert guarded.predicted_budget_cost < greedy.predicted_budget_cost
    # The ladder stays walkable: each block's rungs are consecutive single steps.
    bits = guarded.start_bits.copy()
    for r in guarded.demotions:
        assert bits[r.layer, r.expert, r.proj] == r.from_bits and r.to_bits < r.from_bits
        bits[r.layer, r.expert, r.proj] = r.to_bits
    assert np.all(bits == 2)  # the continuation walks on to the floor


def test_guard_keeps_greedy_when_it_is_predicted_better(tiny_table):
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.02, hot=0.3)
    budget = 3 * tiny_table.num_layers * tiny_table.num_experts * TINY_FOOTPRINT[3]
    inputs = tiny_inputs(share, tiny_table, floors=(), budget=budget)
    guarded = build_ladder(inputs, PlannerConfig())
    greedy = build_ladder(inputs, PlannerConfig(uniform_guard=False))
    assert guarded.budget_anchor == "greedy"
    assert guarded.demotions == greedy.demotions and guarded.promotions == greedy.promotions
    uniform = RungCost(inputs, PlannerConfig()).state_cost(np.full(inputs.current_bits.shape, 3))
    assert guarded.predicted_budget_cost < uniform


def test_guard_margin_decides_between_a_predicted_gain_and_the_uniform_state(tiny_table):
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.02, hot=0.3)
    budget = 3 * tiny_table.num_layers * tiny_table.num_experts * TINY_FOOTPRINT[3]
    inputs = tiny_inputs(share, tiny_table, floors=(), budget=budget)
    greedy = build_ladder(inputs, PlannerConfig(uniform_guard=False))
    uniform = RungCost(inputs, PlannerConfig()).state_cost(np.full(inputs.current_bits.shape, 3))
    gain = 1.0 - greedy.predicted_budget_cost / uniform  # relative, predicted
    assert 0.0 < gain < 0.5
    below = build_ladder(inputs, PlannerConfig(uniform_guard_margin=gain / 2))
    above = build_ladder(inputs, PlannerConfig(uniform_guard_margin=2 * gain))
    assert below.budget_anchor == "greedy"
    assert below.predicted_budget_cost == pytest.approx(greedy.predicted_budget_cost)
    assert above.budget_anchor == "uniform-3"
    assert above.predicted_budget_cost == pytest.approx(uniform)
    np.testing.assert_array_equal(budget_state(above), np.full(inputs.current_bits.shape, 3))


def test_guard_margin_only_protects_a_single_view_state(tiny_table):
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.02, hot=0.3)
    blocks = 3 * tiny_table.num_layers * tiny_table.num_experts
    budget = blocks * (TINY_FOOTPRINT[3] + TINY_FOOTPRINT[4]) // 2  # between the 3- and 4-bit views
    inputs = tiny_inputs(share, tiny_table, floors=(), budget=budget)
    greedy = build_ladder(inputs, PlannerConfig(uniform_guard=False))
    wide = build_ladder(inputs, PlannerConfig(uniform_guard_margin=0.99))
    uniform3 = RungCost(inputs, PlannerConfig()).state_cost(np.full(inputs.current_bits.shape, 3))
    assert greedy.predicted_budget_cost < uniform3
    # The uniform-3 fit keeps promotions here, so it is a mixed state: the margin does not apply.
    assert len(set(budget_state(wide).reshape(-1).tolist())) > 1
    assert wide.predicted_budget_cost <= greedy.predicted_budget_cost


def test_guard_respects_pins_and_floors():
    floors, pins = (Floor(0, 1, 6),), (Pin(0, 0, 8),)
    inputs = flat_inputs(nonconvex_table(), budget=3 * (800 + 600), floors=floors, pins=pins)
    ladder = build_ladder(inputs, PlannerConfig())
    state = budget_state(ladder)
    assert np.all(state[0, 0] == 8) and np.all(state[0, 1] >= 6)
    np.testing.assert_array_equal(uniform_level(inputs.shape, np.full((1, 2, 3), 8), np.array([[2, 6]]),
                                                np.array([[8, -1]]), 4)[0, 1], [6, 6, 6])


@pytest.mark.parametrize("seed", range(6))
def test_convex_path_keeps_the_lower_hull_of_a_host_only_chain(seed):
    """RungCost.convex_path on random monotone tables, walked down and up:
    the ends stay, the kept steps cost more per byte one after another, and
    every skipped bits lies on or above the segment of its kept neighbours."""
    rng = np.random.default_rng(seed)
    views = np.cumsum(rng.exponential(1.0, size=len(VIEWS)))[::-1] - rng.exponential(1.0)  # decreasing in bits
    cost = np.zeros((1, 2, 3, len(BITS_AXIS)))
    cost[..., 1:] = np.maximum(views - views[-1], 0.0)  # cost at 2..8, 0 at 8
    table = SensitivityTable(cost, "random", False)
    cfg = PlannerConfig(host_stall_weight=float(rng.uniform(0.5, 10.0)))  # stalls near the views' costs
    rc = RungCost(tiny_inputs(np.ones((1, 2)), table, floors=(Floor(None, None, 0),)), cfg)
    chain = (8, 6, 4, 3, 2, 0)
    for path in (chain, chain[::-1], chain[2:]):
        kept = rc.convex_path(0, 0, 0, path)
        assert kept[0] == path[0] and kept[-1] == path[-1] and set(kept) <= set(path)
        assert [b for b in path if b in kept] == list(kept)  # the path's order
        point = {b: (TINY_FOOTPRINT[b], rc.block_cost(0, 0, 0, b)) for b in path}
        by_bytes = sorted(kept, key=lambda b: point[b][0])
        slopes = [(point[b][1] - point[a][1]) / (point[b][0] - point[a][0]) for a, b in zip(by_bytes, by_bytes[1:])]
        assert slopes == sorted(slopes)  # convex: cost falls less per byte as bytes grow
        for b in set(path) - set(kept):
            lo = max((k for k in by_bytes if point[k][0] < point[b][0]), key=lambda k: point[k][0])
            hi = min((k for k in by_bytes if point[k][0] > point[b][0]), key=lambda k: point[k][0])
            (x0, y0), (x1, y1), (x, y) = point[lo], point[hi], point[b]
            assert y >= y0 + (y1 - y0) * (x - x0) / (x1 - x0) - 1e-12


def test_budget_state_keeps_blocks_off_the_host_unless_the_step_overhead_pays_or_the_budget_needs_it(tiny_table):
    """fit_to_budget: with cheap stalls the uniform-3 budget is met by putting
    blocks on the host, but a state with any host-only block also pays a
    per-step overhead where one is set (PlannerConfig.host_only_step_overhead_s;
    session 53's eager steps measured 5.6-8.8 ms), which keeps them on the
    GPU; below the all-2-bit bytes only host-only can meet the budget."""
    share = skewed_share(tiny_table.num_layers, tiny_table.num_experts, cold=0.005, hot=0.3)
    blocks = tiny_table.num_layers * tiny_table.num_experts * 3
    host_only_in_state = {}
    for overhead in (0.0, EAGER_STEP_S):
        cfg = at_fetch_price(CHEAP_STALL, host_only_step_overhead_s=overhead)
        ladder = build_ladder(tiny_inputs(share, tiny_table, budget=TINY_FOOTPRINT[3] * blocks), cfg)
        state = budget_state(ladder)
        assert ladder.budget_feasible
        host_only_in_state[overhead] = int((state == 0).sum())
        # Past the budget state the demotions still reach the host.
        assert any(r.to_bits == 0 for r in ladder.demotions[ladder.budget_rungs:])
    assert host_only_in_state[0.0] > 0 and host_only_in_state[EAGER_STEP_S] == 0
    tight = build_ladder(tiny_inputs(share, tiny_table, budget=TINY_FOOTPRINT[2] * (blocks - 3)),
                         at_fetch_price(CHEAP_STALL))
    assert tight.budget_feasible and (budget_state(tight) == 0).sum() >= 3
