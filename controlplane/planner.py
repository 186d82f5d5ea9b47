"""Precision planner: pure functions from (model shape, sensitivity, activity,
current bits, floors, pins, budget) to a ladder of single-step rungs. No I/O,
no clocks, no protobuf (controlplane/convert.py converts).

Quality of one rung of block i = (layer l, expert e, projection p), from
bits a to bits b:

    dQ = importance[l, e] * |sens_i(b) - sens_i(a)|                (views)
    dQ = max(0, importance[l, e] * (sens_i(0) - sens_i(v)) + stall_i)
                                          (host-only: a or b is 0, v the other)

    importance = (E * mix) ** importance_exponent + importance_floor
    mix        = (w_share*share + w_prob*prob + w_demand*demand)
                 / (w_share + w_prob + w_demand)
    stall_i    = host_stall_weight * worst_cost / reference_step_s
                 * read_prob[l, e] * (host_read_latency_s + bytes_i(8) / host_bw)
    read_prob  = 1 - (1 - route_prob)^B   (chance a step of B sequences reads it;
                                           B = host_price_batch or the running batch)
    route_prob = min(1, top_k * share)    (chance a token needs the expert)
    worst_cost = sum over blocks of sens_i(lowest view)   (table units)

(the MoE kernels read a host-only block in place from pinned host memory
at its master view for each use, dataplane/weights/store.py: sens_i(0) is
the 8-bit cost, 0 in a current profile, so the host-only rung trades the
lowest views' quality loss for the read stall; PlannerConfig states why the
stall is priced so).
dM = |bytes_i(a) - bytes_i(b)| from the Hello's footprints. Demotions are a
greedy walk of a priority queue keyed by dQ/dM ascending; promotions one
keyed by dQ/dM descending. A block enters the queue with its first rung and
its next rung is pushed only when the previous one is popped, so a block's
rungs appear in order (8->6 before 6->4) and each rung is one step of the
block's allowed chain: the supported views between its floor and the
ceiling, plus 0 when its floor is 0 (host-only is the last rung). A chain
that reaches host-only keeps only the bits on the lower convex hull of its
(bytes, cost) points (RungCost.convex_path): a block whose host-only state
costs less than its low views goes to the host in one step (8 -> 0, or
8 -> 4 -> 0) instead of paying each view's loss first, and the steps of
such a chain cost more per byte one after another, as the greedy walk
assumes.

Each list is complete (rungs.both_ways): besides the chains from the start
state it holds, merged by the same key, the chains on the other side of it
(demotions from the ceiling down to a block's start bits, promotions from its
floor up to them). The dataplane walks a plan in both directions: a block it
demoted under pressure must find its way back up at the price of that step,
not wait for the next plan while other blocks climb past it. Without them a
walk that went down and partly up again strands blocks at 3 bits next to
blocks at 6 (measured live on the default model: 18-40 % above the plan's
own predicted optimum at the same pages; benchmarks/NOTES.md, session 40).

The ladder starts from the dataplane's current bits with two corrections,
whose rungs are *mandatory* and lead their lists (one direct rung per block):
pinned experts go to their pin bits (pins never appear otherwise), blocks
below their floor go up to it. From that state T the greedy demotions follow;
with a memory budget, the first budget_rungs of them bring the expert bytes
within the budget, and the promotions start after them and stop before the
budget would be exceeded (budget_promotions of them; the complete list
follows). With uniform_guard (controlplane/budget_guard.py)
the budget prefix may instead be the walk to the best uniform view that
fits, unless the greedy state is predicted cheaper by more than
uniform_guard_margin. Where floors allow host-only, the budget state keeps
no block on the host unless the budget needs it or it is predicted cheaper
after paying PlannerConfig.host_only_step_overhead_s (fit_to_budget); the
lists past the budget state still reach host-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.budget_guard import BudgetFit, fit_budget
from controlplane.config import PlannerConfig
from controlplane.rungs import (  # noqa: F401 (re-exported: the planner's public types)
    HOST_ONLY,
    NOT_PINNED,
    NUM_PROJECTIONS,
    Constraints,
    ModelShape,
    PlanInputs,
    Rung,
    RungCost,
    apply_rungs,
    block_chain,
    both_ways,
    chains,
    expert_importance,
    greedy_walk,
    route_probability,
)
from controlplane.store import Floor, Pin


@dataclass(frozen=True)
class Ladder:
    start_bits: np.ndarray  # [L, E, 3] state T: current bits after the mandatory rungs
    demotions: tuple[Rung, ...]  # mandatory first, then dQ/dM ascending
    promotions: tuple[Rung, ...]  # mandatory first, then dQ/dM descending
    start_bytes: int  # expert bytes at T
    budget_bytes: int  # 0 = none
    budget_rungs: int  # greedy demotions (after the mandatory ones) needed to fit the budget
    budget_promotions: int  # promotions (after the mandatory ones) that spend what the budget rungs freed beyond it
    budget_feasible: bool  # False: floors and pins keep the bytes above the budget
    floor_bits: np.ndarray  # [L, E, 3] minimum bits per block: floors, and pins at their bits
    corrective_demotions: int  # leading demotions that lower pinned blocks to their pin
    corrective_promotions: int  # leading promotions that raise blocks to their floor or pin
    budget_anchor: str = "greedy"  # how the budget prefix was chosen: "greedy" or "uniform-<bits>"
    predicted_budget_cost: float = 0.0  # predicted cost of the budget state (0 without a budget)



def effective_floors(shape: ModelShape, floors: tuple[Floor, ...], default_floor_bits: int) -> np.ndarray:
    """[L, E] minimum bits per expert: the max of every floor that applies
    (model, layer, expert; the default when none does), raised to the
    smallest supported view at or above it (0 stays 0: host-only allowed).
    Floors outside the shape are ignored."""
    L, E = shape.num_layers, shape.num_experts
    model = [f.min_bits for f in floors if f.layer is None]
    out = np.full((L, E), max(model) if model else default_floor_bits, dtype=np.int64)
    has_floor = np.full((L, E), bool(model))  # False: out holds the default
    for f in floors:
        if f.layer is None or f.layer >= L or (f.expert is not None and f.expert >= E):
            continue
        sel = (f.layer, slice(None)) if f.expert is None else (f.layer, f.expert)
        out[sel] = np.where(has_floor[sel], np.maximum(out[sel], f.min_bits), f.min_bits)
        has_floor[sel] = True
    views = np.asarray(shape.view_bits)
    idx = np.minimum(np.searchsorted(views, out), len(views) - 1)
    return np.where(out == HOST_ONLY, HOST_ONLY, views[idx])


def pinned_bits(shape: ModelShape, pins: tuple[Pin, ...]) -> np.ndarray:
    """[L, E] pin bits (raised to a supported view like floors), NOT_PINNED
    where none. Pins outside the shape are ignored."""
    out = np.full((shape.num_layers, shape.num_experts), NOT_PINNED, dtype=np.int64)
    views = shape.view_bits
    for p in pins:
        if p.layer < shape.num_layers and p.expert < shape.num_experts:
            out[p.layer, p.expert] = (
                HOST_ONLY if p.bits == HOST_ONLY else next((v for v in views if v >= p.bits), views[-1])
            )
    return out


def fit_to_budget(cost: RungCost, shape: ModelShape, target: np.ndarray, floors: np.ndarray, pins: np.ndarray,
                  budget: int, cfg: PlannerConfig) -> BudgetFit:
    """budget_guard.fit_budget from state target, and, where floors allow
    host-only, the same with those floors at the lowest view: a budget state
    that keeps any block on the host also pays cost.host_only_overhead (every
    step eager, PlannerConfig.host_only_step_overhead_s). The fit predicted
    cheaper with it wins, the one without host-only on a tie; an infeasible
    fit loses to a feasible one."""
    def fit(fl: np.ndarray) -> BudgetFit:
        greedy = greedy_walk(chains(cost, shape, target, fl, pins, down=True), descending=False)
        return fit_budget(cost, shape, target, greedy, fl, pins, budget, cfg.uniform_guard, cfg.uniform_guard_margin)

    with_host = fit(floors)
    if cost.host_only_overhead <= 0.0 or not (floors == HOST_ONLY).any():
        return with_host
    without = fit(np.where(floors == HOST_ONLY, shape.view_bits[0], floors))

    def priced(f: BudgetFit) -> float:
        state = apply_rungs(apply_rungs(target, f.prefix), f.promotions)
        return f.predicted_cost + (cost.host_only_overhead if (state == HOST_ONLY).any() else 0.0)

    if without.feasible and (not with_host.feasible or priced(without) <= priced(with_host)):
        return without
    return with_host


def build_ladder(inputs: PlanInputs, cfg: PlannerConfig) -> Ladder:
    """The ladder of the module doc. Contract: every rung is one step of its
    block's allowed chain (mandatory rungs excepted: one direct jump); within
    a list a block's rungs are consecutive steps in order; pinned experts only
    appear in mandatory rungs; no greedy rung goes below a floor."""
    shape = inputs.shape
    current = np.asarray(inputs.current_bits, dtype=np.int64).reshape(
        shape.num_layers, shape.num_experts, NUM_PROJECTIONS
    )
    floors = effective_floors(shape, inputs.constraints.floors, cfg.default_floor_bits)  # [L, E]
    pins = pinned_bits(shape, inputs.constraints.pins)  # [L, E]
    cost = RungCost(inputs, cfg)

    # State T: pins at their bits, blocks below their floor raised to it.
    target = np.where(pins[:, :, None] != NOT_PINNED, pins[:, :, None], current)
    below = (pins[:, :, None] == NOT_PINNED) & (target < floors[:, :, None])
    target = np.where(below, floors[:, :, None], target)
    mandatory_down: list[Rung] = []
    mandatory_up: list[Rung] = []
    for layer, expert, proj in zip(*np.nonzero(target != current)):
        a, b = int(current[layer, expert, proj]), int(target[layer, expert, proj])
        rung = cost.rung(int(layer), int(expert), int(proj), a, b)
        (mandatory_down if b < a else mandatory_up).append(rung)

    start_bytes = shape.expert_bytes(target)
    budget = inputs.constraints.budget_bytes
    if budget > 0:
        fit = fit_to_budget(cost, shape, target, floors, pins, budget, cfg)
        fitted = apply_rungs(target, fit.prefix)  # the budget state
        demotions = both_ways(cost, shape, fitted, floors, pins, down=True, head=fit.prefix)
        promotions = both_ways(cost, shape, apply_rungs(fitted, fit.promotions), floors, pins, down=False,
                               head=fit.promotions)
        budget_rungs, budget_promotions = len(fit.prefix), len(fit.promotions)
        feasible, anchor, predicted = fit.feasible, fit.anchor, fit.predicted_cost
    else:
        demotions = both_ways(cost, shape, target, floors, pins, down=True)
        promotions = both_ways(cost, shape, target, floors, pins, down=False)
        budget_rungs, budget_promotions, feasible, anchor, predicted = 0, 0, True, "greedy", 0.0
    return Ladder(
        start_bits=target,
        demotions=tuple(mandatory_down + demotions),
        promotions=tuple(mandatory_up + promotions),
        start_bytes=start_bytes,
        budget_bytes=budget,
        budget_rungs=budget_rungs,
        budget_promotions=budget_promotions,
        budget_feasible=feasible,
        floor_bits=np.broadcast_to(np.where(pins != NOT_PINNED, pins, floors)[:, :, None], current.shape).copy(),
        corrective_demotions=len(mandatory_down),
        corrective_promotions=len(mandatory_up),
        budget_anchor=anchor,
        predicted_budget_cost=predicted,
    )
