"""Fitting a ladder to a memory budget: the greedy prefix, and the uniform guard.

With a budget, a ladder's demotions start with a *prefix* that brings the
expert bytes within the budget; the promotions then spend what the prefix
freed beyond it (planner.build_ladder completes both lists after them). Two ways to choose the prefix:

* greedy: the first rungs of the greedy walk (planner.greedy_walk) until the
  bytes fit. The walk is optimal only when every block's steps are convex in
  cost per byte and the last rung lands exactly on the budget; neither holds
  in general (the calibrated table of the default model has non-convex
  blocks, and a budget at a uniform view's bytes is hit from above by a
  rung of any size).
* uniform-<v>: every movable block (not pinned) steps down to max(v, its
  floor), v the highest supported view whose state fits the budget; this is
  the best static uniform bitwidth that fits, under the operator's floors
  and pins.

``fit_budget`` evaluates both (prefix + kept promotions) with the planner's
own predicted cost (RungCost.state_cost) and returns the greedy one only
when it is predicted cheaper: by more than ``margin`` (relative;
PlannerConfig.uniform_guard_margin says why it is not zero) when the uniform
fit is a single-view state (no promotions fit on top of it), by more than
float noise otherwise. So a plan is never predicted worse than the uniform
bitwidth that fits. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.rungs import NOT_PINNED, ModelShape, Rung, RungCost, apply_rungs, block_chain, chains
from controlplane.rungs import greedy_walk

GREEDY = "greedy"
# Equal predictions (within float noise) count as a tie, which the uniform
# state wins whatever the configured margin.
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class BudgetFit:
    """How the ladder reaches its budget state."""

    prefix: list[Rung]  # demotions from T to the budget state
    promotions: list[Rung]  # greedy promotions from the budget state that keep the budget
    fitted_bytes: int  # expert bytes after the prefix
    feasible: bool  # False: the prefix could not reach the budget
    anchor: str  # GREEDY or "uniform-<bits>"
    predicted_cost: float  # RungCost.state_cost of the budget state after the promotions


def kept_promotions(promotions: list[Rung], room: int) -> list[Rung]:
    """The leading promotions whose bytes fit ``room`` (stops at the first
    that does not: the order is the plan's priority)."""
    kept = 0
    for r in promotions:
        if -r.bytes_delta > room:
            break
        room += r.bytes_delta
        kept += 1
    return promotions[:kept]


def _finish(cost: RungCost, shape: ModelShape, start: np.ndarray, prefix: list[Rung],
            floors: np.ndarray, pins: np.ndarray, budget: int, anchor: str) -> BudgetFit:
    fitted = apply_rungs(start, prefix)
    fitted_bytes = shape.expert_bytes(fitted)
    ups = greedy_walk(chains(cost, shape, fitted, floors, pins, down=False), descending=True)
    ups = kept_promotions(ups, budget - fitted_bytes)
    return BudgetFit(prefix, ups, fitted_bytes, fitted_bytes <= budget, anchor,
                     cost.state_cost(apply_rungs(fitted, ups)))


def greedy_fit(cost: RungCost, shape: ModelShape, start: np.ndarray, demotions: list[Rung],
               floors: np.ndarray, pins: np.ndarray, budget: int) -> BudgetFit:
    """The greedy prefix: leading ``demotions`` (the greedy walk from start)
    until the bytes fit."""
    fitted_bytes, n = shape.expert_bytes(start), 0
    while fitted_bytes > budget and n < len(demotions):
        fitted_bytes -= demotions[n].bytes_delta
        n += 1
    return _finish(cost, shape, start, demotions[:n], floors, pins, budget, GREEDY)


def uniform_level(shape: ModelShape, start: np.ndarray, floors: np.ndarray, pins: np.ndarray,
                  view: int) -> np.ndarray:
    """[L, E, 3] start with every movable block above max(view, floor)
    lowered to it; pinned experts and blocks already below keep their bits."""
    level = np.maximum(view, floors)[:, :, None]  # [L, E, 1]
    movable = (pins == NOT_PINNED)[:, :, None]  # [L, E, 1]
    return np.where(movable & (start > level), level, start)


def uniform_fit(cost: RungCost, shape: ModelShape, start: np.ndarray, floors: np.ndarray, pins: np.ndarray,
                budget: int) -> BudgetFit | None:
    """The uniform prefix at the highest view that fits; None when none does."""
    for view in reversed(shape.view_bits):
        state = uniform_level(shape, start, floors, pins, view)
        if shape.expert_bytes(state) <= budget:
            break
    else:
        return None
    steps: list[list[Rung]] = []
    for layer, expert, proj in zip(*np.nonzero(state != start)):
        layer, expert, proj = int(layer), int(expert), int(proj)
        allowed = block_chain(shape, int(floors[layer, expert]))
        a, b = int(start[layer, expert, proj]), int(state[layer, expert, proj])
        path = allowed[allowed.index(a):allowed.index(b) + 1]
        steps.append([cost.rung(layer, expert, proj, x, y) for x, y in zip(path, path[1:])])
    prefix = greedy_walk(steps, descending=False)
    return _finish(cost, shape, start, prefix, floors, pins, budget, f"uniform-{view}")


def fit_budget(cost: RungCost, shape: ModelShape, start: np.ndarray, demotions: list[Rung],
               floors: np.ndarray, pins: np.ndarray, budget: int, guard: bool, margin: float = 0.0) -> BudgetFit:
    """The greedy fit, or (with ``guard``) the uniform one when it fits and
    the greedy one is not predicted cheaper by more than ``margin`` (module doc)."""
    greedy = greedy_fit(cost, shape, start, demotions, floors, pins, budget)
    if not guard:
        return greedy
    uniform = uniform_fit(cost, shape, start, floors, pins, budget)
    if uniform is None or not uniform.feasible:
        return greedy
    if not greedy.feasible:
        return uniform
    # The margin protects a single-view state (the known static point, and
    # the fastest for the kernels); once promotions are kept on top of the
    # uniform prefix both candidates are mixed and the cheaper one wins.
    required = max(margin, TIE_TOLERANCE) if not uniform.promotions else TIE_TOLERANCE
    if greedy.predicted_cost < uniform.predicted_cost * (1.0 - required):
        return greedy
    return uniform
