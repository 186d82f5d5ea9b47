"""Planner unit tests: pure functions, no I/O."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.config import PlannerConfig
from controlplane.planner import Rung, block_chain, build_ladder, effective_floors, expert_importance
from controlplane.sensitivity import BITS_AXIS, SensitivityTable
from controlplane.store import Floor, Pin
from tests.controlplane.cp_helpers import PLAN_E as E
from tests.controlplane.cp_helpers import PLAN_L as L
from tests.controlplane.cp_helpers import VIEWS, activity, make_inputs, make_shape

CFG = PlannerConfig()



def random_table(seed: int) -> SensitivityTable:
    """Monotone in bits but not convex: greedy order matters."""
    rng = np.random.default_rng(seed)
    steps = rng.exponential(1.0, size=(L, E, 3, len(VIEWS) - 1))  # [L, E, 3, 4] cost added per step down
    views = np.concatenate([np.cumsum(steps[..., ::-1], axis=-1)[..., ::-1], np.zeros((L, E, 3, 1))], axis=-1)
    return SensitivityTable(np.concatenate([views[..., :1], views], axis=-1), "random", False)


def convex_random_table(seed: int) -> SensitivityTable:
    """Convex in bytes for every block, with random prices: the cost per
    byte of each step down grows from 8->6 to 3->2, no two blocks alike."""
    shape = make_shape()
    rng = np.random.default_rng(seed)
    price = np.cumsum(rng.exponential(1.0, size=(L, E, 3, len(VIEWS) - 1)), axis=-1)  # [L, E, 3, 4] per byte, 8->6 first
    cost = np.zeros((L, E, 3, len(BITS_AXIS)))
    for proj in range(3):
        down = list(reversed(VIEWS))
        freed = np.array([shape.bytes_at(proj, a) - shape.bytes_at(proj, b) for a, b in zip(down, down[1:])])
        at_view = np.cumsum(price[:, :, proj] * freed, axis=-1)  # [L, E, 4] cost at 6, 4, 3, 2
        for i, bits in enumerate(down[1:]):
            cost[:, :, proj, BITS_AXIS.index(bits)] = at_view[..., i]
    cost[..., 0] = cost[..., BITS_AXIS.index(VIEWS[0])]
    return SensitivityTable(cost, "convex random", False)


def ratio(r: Rung) -> float:
    return r.quality_delta / abs(r.bytes_delta)


def chains_by_block(rungs) -> dict[tuple, list[Rung]]:
    out: dict[tuple, list[Rung]] = {}
    for r in rungs:
        out.setdefault((r.layer, r.expert, r.proj), []).append(r)
    return out


def test_importance_formula():
    uniform = expert_importance(activity(), CFG)
    np.testing.assert_allclose(uniform, 1.0 + CFG.importance_floor)
    skew = expert_importance(activity(routed=[[3, 1, 0, 0], [1, 1, 1, 1]], demand=[[0, 0, 0, 4], [1, 1, 1, 1]]), CFG)
    w = CFG.weight_share + CFG.weight_prob
    mix_00 = (w * 0.75 + CFG.weight_demand * 0.0) / (w + CFG.weight_demand)
    assert skew[0, 0] == pytest.approx((E * mix_00) ** CFG.importance_exponent + CFG.importance_floor)
    assert skew[0, 3] > skew[0, 2]  # demand alone lifts an unrouted expert


@pytest.mark.parametrize("exponent", [1.0, 1.5, 2.0])
def test_importance_exponent_keeps_uniform_at_one_and_sharpens_skew(exponent):
    cfg = PlannerConfig(importance_exponent=exponent, importance_floor=0.0)
    np.testing.assert_allclose(expert_importance(activity(), cfg), 1.0)
    skew = expert_importance(activity(routed=[[3, 1, 0, 0], [1, 1, 1, 1]]), cfg)
    # A share of 3/4 over E = 4 experts is 3x an even share.
    assert skew[0, 0] == pytest.approx(3.0 ** exponent)
    assert skew[0, 1] == pytest.approx(1.0)


@pytest.mark.parametrize("exponent", [0.0, -1.0, 5.0])
def test_importance_exponent_is_validated(exponent):
    with pytest.raises(ValueError):
        PlannerConfig(importance_exponent=exponent)


@pytest.mark.parametrize("seed", range(5))
def test_demotions_are_a_greedy_walk_by_cost_per_byte(seed):
    routed = np.random.default_rng(seed).integers(0, 100, size=(L, E))
    ladder = build_ladder(make_inputs(table=random_table(seed), act=activity(routed)), CFG)
    # Reference: at each point the emitted rung is the cheapest per byte among
    # every block's next rung (the frontier).
    chains = {k: list(v) for k, v in chains_by_block(ladder.demotions).items()}
    for rung in ladder.demotions:
        frontier = [c[0] for c in chains.values() if c]
        assert ratio(rung) <= min(ratio(r) for r in frontier) + 1e-15
        chains[(rung.layer, rung.expert, rung.proj)].pop(0)
    # Promotions from a low state: the most benefit per byte first.
    ladder = build_ladder(make_inputs(table=random_table(seed), current=np.full((L, E, 3), 2)), CFG)
    chains = {k: list(v) for k, v in chains_by_block(ladder.promotions).items()}
    for rung in ladder.promotions:
        assert ratio(rung) >= max(ratio(c[0]) for c in chains.values() if c) - 1e-15
        chains[(rung.layer, rung.expert, rung.proj)].pop(0)


def test_convex_costs_give_globally_sorted_lists():
    ladder = build_ladder(make_inputs(current=np.full((L, E, 3), 4)), CFG)
    demote = [ratio(r) for r in ladder.demotions]
    promote = [ratio(r) for r in ladder.promotions]
    assert demote == sorted(demote) and promote == sorted(promote, reverse=True)
    assert all(r.bytes_delta > 0 for r in ladder.demotions) and all(r.bytes_delta < 0 for r in ladder.promotions)


def test_rungs_of_a_block_are_single_steps_in_order():
    current = np.random.default_rng(0).choice(VIEWS, size=(L, E, 3))
    ladder = build_ladder(make_inputs(table=random_table(1), current=current), CFG)
    chain = block_chain(make_shape(), 2)
    up = chain[::-1]
    for (layer, expert, proj), rungs in chains_by_block(ladder.demotions).items():
        at = int(current[layer, expert, proj])
        # From the current bits down to the floor in order, and the way back
        # down from the ceiling to them, also in order: every view but the
        # floor has exactly one rung.
        below = [r for r in rungs if r.from_bits <= at]
        above = [r for r in rungs if r.from_bits > at]
        assert [at] + [r.to_bits for r in below] == list(chain[chain.index(at):])
        assert [r.from_bits for r in above] == list(chain[:chain.index(at)])
        assert [r.to_bits for r in above] == list(chain[1:chain.index(at) + 1])
    for (layer, expert, proj), rungs in chains_by_block(ladder.promotions).items():
        at = int(current[layer, expert, proj])
        above = [r for r in rungs if r.from_bits >= at]
        below = [r for r in rungs if r.from_bits < at]
        assert [at] + [r.to_bits for r in above] == list(up[up.index(at):])
        assert [r.from_bits for r in below] == list(up[:up.index(at)])
        assert [r.to_bits for r in below] == list(up[1:up.index(at) + 1])
    every = {(layer, expert, proj) for layer in range(L) for expert in range(E) for proj in range(3)}
    assert set(chains_by_block(ladder.demotions)) == every == set(chains_by_block(ladder.promotions))


def first_applicable(rungs, bits):
    return next((r for r in rungs if bits[r.layer, r.expert, r.proj] == r.from_bits), None)


@pytest.mark.parametrize("seed", range(4))
def test_a_walk_down_and_back_up_stays_on_the_greedy_path(seed):
    """The dataplane takes the first applicable rung of a list. Walking k
    demotions and then m promotions under one plan must land where k - m
    demotions land (convex costs): a block demoted under pressure comes back
    first, rather than other blocks climbing past it."""
    rng = np.random.default_rng(seed)
    ladder = build_ladder(make_inputs(table=convex_random_table(seed), act=activity(rng.integers(1, 100, size=(L, E)))),
                          CFG)
    walks = []
    for k in range(0, len(ladder.demotions) + 1, 5):
        bits = ladder.start_bits.copy()
        for _ in range(k):
            r = first_applicable(ladder.demotions, bits)
            bits[r.layer, r.expert, r.proj] = r.to_bits
        walks.append(bits)
    for k, down in enumerate(walks):
        for m in range(k + 1):
            bits = down.copy()
            for _ in range(5 * m):
                r = first_applicable(ladder.promotions, bits)
                bits[r.layer, r.expert, r.proj] = r.to_bits
            np.testing.assert_array_equal(bits, walks[k - m])


def test_floors_take_the_max_applicable():
    floors = (Floor(None, None, 3), Floor(1, None, 6), Floor(1, 2, 4), Floor(0, 1, 8), Floor(9, None, 8))
    eff = effective_floors(make_shape(), floors, default_floor_bits=2)
    expected = np.array([[3, 8, 3, 3], [6, 6, 6, 6]])
    np.testing.assert_array_equal(eff, expected)
    ladder = build_ladder(make_inputs(floors=floors), CFG)
    for r in ladder.demotions:
        assert r.to_bits >= expected[r.layer, r.expert]
    assert not [r for r in ladder.demotions if (r.layer, r.expert) == (0, 1)]
    # A floor between views rounds up to the next supported view.
    eff = effective_floors(make_shape(views=(2, 4, 8)), (Floor(None, None, 3),), 2)
    assert np.all(eff == 4)


def test_host_only_rung_only_when_floors_allow_it():
    ladder = build_ladder(make_inputs(), CFG)  # default floor 2
    assert all(r.to_bits != 0 for r in ladder.demotions)
    ladder = build_ladder(make_inputs(floors=(Floor(1, 3, 0),)), CFG)
    host_only = [r for r in ladder.demotions if r.to_bits == 0]
    assert [(r.layer, r.expert) for r in host_only] == [(1, 3)] * 3
    assert all(r.from_bits in VIEWS for r in host_only)  # from a view on the chain's hull (RungCost.convex_path)
    # A coarser floor above 0 wins over the expert's 0 (max applicable).
    ladder = build_ladder(make_inputs(floors=(Floor(1, 3, 0), Floor(1, None, 2))), CFG)
    assert all(r.to_bits != 0 for r in ladder.demotions)
    # Host-only everywhere: it is the last rung of each block, and its cost
    # grows with the expert's routing probability. With sens(0) = sens(2) the
    # rung is the fetch stall alone (the fallback's sens(0) is the master's, 0).
    routed = np.array([[100, 1, 1, 1], [1, 1, 1, 1]])
    fallback = make_inputs().sensitivity.cost
    stall_only = SensitivityTable(np.concatenate([fallback[..., 1:2], fallback[..., 1:]], axis=-1), "stall", False)
    ladder = build_ladder(make_inputs(table=stall_only, floors=(Floor(None, None, 0),), act=activity(routed)), CFG)
    for rungs in chains_by_block(ladder.demotions).values():
        assert rungs[-1].to_bits == 0 and all(r.to_bits != 0 for r in rungs[:-1])
    cost = {(r.layer, r.expert, r.proj): r.quality_delta for r in ladder.demotions if r.to_bits == 0}
    assert cost[(0, 0, 0)] > cost[(0, 1, 0)] > 0


def test_pins_are_fixed():
    pins = (Pin(0, 2, 4), Pin(1, 1, 8))
    ladder = build_ladder(make_inputs(pins=pins), CFG)
    # (1, 1) is at its pin already: absent. (0, 2) must go 8 -> 4: one
    # mandatory rung per block, leading the demotions, and nothing else.
    assert not [r for r in ladder.demotions + ladder.promotions if (r.layer, r.expert) == (1, 1)]
    pinned = [r for r in ladder.demotions + ladder.promotions if (r.layer, r.expert) == (0, 2)]
    assert sorted((r.proj, r.from_bits, r.to_bits) for r in pinned) == [(0, 8, 4), (1, 8, 4), (2, 8, 4)]
    assert all((r.layer, r.expert) == (0, 2) for r in ladder.demotions[:3])
    assert np.all(ladder.start_bits[0, 2] == 4)


def test_below_floor_blocks_lead_the_promotions():
    current = np.full((L, E, 3), 8)
    current[1, 0, 1] = 2
    ladder = build_ladder(make_inputs(current=current, floors=(Floor(None, None, 4),)), CFG)
    first = ladder.promotions[0]
    assert (first.layer, first.expert, first.proj, first.from_bits, first.to_bits) == (1, 0, 1, 2, 4)
    assert ladder.start_bits[1, 0, 1] == 4


def test_memory_budget_start_point():
    shape = make_shape()
    full = shape.expert_bytes(np.full((L, E, 3), 8))
    budget = int(full * 0.6)
    # The greedy prefix's mechanics; the guard's choice is tested in test_cp_host_and_guard.py.
    ladder = build_ladder(make_inputs(budget=budget), CFG.model_copy(update={"uniform_guard": False}))
    assert ladder.budget_anchor == "greedy"
    freed = np.cumsum([r.bytes_delta for r in ladder.demotions])
    k = ladder.budget_rungs
    assert ladder.budget_feasible and k > 0
    assert full - freed[k - 1] <= budget < full - (freed[k - 2] if k > 1 else 0)
    # The budget's promotions follow the mandatory ones and never exceed the budget.
    kept = ladder.promotions[ladder.corrective_promotions:ladder.corrective_promotions + ladder.budget_promotions]
    assert full - freed[k - 1] - sum(r.bytes_delta for r in kept) <= budget
    # Floors can make a budget unreachable.
    ladder = build_ladder(make_inputs(budget=budget, floors=(Floor(None, None, 8),)), CFG)
    assert not ladder.budget_feasible and ladder.demotions == ()
    # Under budget: nothing is forced.
    assert build_ladder(make_inputs(budget=full), CFG).budget_rungs == 0


def test_sensitivity_of_table_drives_order():
    cost = np.zeros((L, E, 3, len(BITS_AXIS)))
    cost[..., 1:] = [4.0, 2.0, 1.0, 0.5, 0.0]
    cost[0, 0, 0, 1:] = [400.0, 200.0, 100.0, 50.0, 0.0]
    ladder = build_ladder(make_inputs(table=SensitivityTable(cost, "t", False)), CFG)
    sensitive = [i for i, r in enumerate(ladder.demotions) if (r.layer, r.expert, r.proj) == (0, 0, 0)]
    assert sensitive == list(range(len(ladder.demotions) - 4, len(ladder.demotions)))
