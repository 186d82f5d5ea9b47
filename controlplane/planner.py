"""Precision planner: pure functions from (model shape, sensitivity, activity,
current bits, floors, pins, budget) to a ladder of single-step rungs. No I/O,
no clocks, no protobuf (controlplane/plan_proto.py converts).

Quality of one rung of block i = (layer l, expert e, projection p), from
bits a to bits b:

    dQ = importance[l, e] * |sens_i(b) - sens_i(a)|                (views)
       + host_stall_cost_per_s * route_prob[l, e] * bytes_i(v) / host_bw
                                          (only when a or b is 0, host-only;
                                           v = the non-zero end)

    importance = E * (w_share*share + w_prob*prob + w_demand*demand)
                     / (w_share + w_prob + w_demand) + importance_floor
    route_prob = min(1, top_k * share)    (chance a token needs the expert)

and dM = |bytes_i(a) - bytes_i(b)| from the Hello's footprints. Demotions are
a greedy walk of a priority queue keyed by dQ/dM ascending; promotions one
keyed by dQ/dM descending. A block enters the queue with its first rung and
its next rung is pushed only when the previous one is popped, so a block's
rungs appear in order (8->6 before 6->4) and each rung is one step of the
block's allowed chain: the supported views between its floor and the ceiling,
plus 0 when its floor is 0 (host-only is the last rung).

The ladder starts from the dataplane's current bits with two corrections,
whose rungs are *mandatory* and lead their lists (one direct rung per block):
pinned experts go to their pin bits (pins never appear otherwise), blocks
below their floor go up to it. From that state T the greedy demotions follow;
with a memory budget, the first budget_rungs of them bring the expert bytes
within the budget, and the promotions start after them and stop before the
budget would be exceeded.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from controlplane.activity import ActivitySnapshot
from controlplane.config import PlannerConfig
from controlplane.sensitivity import SensitivityTable
from controlplane.store import Floor, Pin

NUM_PROJECTIONS = 3  # gate, up, down (WEIGHT_LAYOUT.md block order)
HOST_ONLY = 0
NOT_PINNED = -1


@dataclass(frozen=True)
class ModelShape:
    """What a dataplane serves, from its Hello."""

    num_layers: int
    num_experts: int
    top_k: int
    view_bits: tuple[int, ...]  # supported views, ascending, e.g. (2, 3, 4, 6, 8)
    footprint_bytes: tuple[Mapping[int, int], ...]  # [proj] -> {bits (views and 0): bytes}

    @property
    def ceiling_bits(self) -> int:
        return self.view_bits[-1]

    def bytes_at(self, proj: int, bits: int) -> int:
        return self.footprint_bytes[proj][bits]

    def expert_bytes(self, bits: np.ndarray) -> int:
        """GPU bytes of all expert blocks at bits [L, E, 3]."""
        total = 0
        for proj in range(NUM_PROJECTIONS):
            for b, count in zip(*np.unique(bits[:, :, proj], return_counts=True)):
                total += self.bytes_at(proj, int(b)) * int(count)
        return total


@dataclass(frozen=True)
class Constraints:
    """Operator bounds (controlplane/store.py); budget 0 = none."""

    floors: tuple[Floor, ...] = ()
    pins: tuple[Pin, ...] = ()
    budget_bytes: int = 0


@dataclass(frozen=True)
class PlanInputs:
    shape: ModelShape
    sensitivity: SensitivityTable  # [L, E, 3, bits]
    activity: ActivitySnapshot  # [L, E] distributions
    current_bits: np.ndarray  # [L, E, 3] int, as in TelemetryReport.block_bits
    constraints: Constraints


@dataclass(frozen=True)
class Rung:
    """One step of one block. bytes_delta > 0 frees (demotion), < 0 needs
    (promotion); quality_delta >= 0 is the cost (demotion) or the benefit
    (promotion)."""

    layer: int
    expert: int
    proj: int
    from_bits: int
    to_bits: int
    bytes_delta: int
    quality_delta: float


@dataclass(frozen=True)
class Ladder:
    start_bits: np.ndarray  # [L, E, 3] state T: current bits after the mandatory rungs
    demotions: tuple[Rung, ...]  # mandatory first, then dQ/dM ascending
    promotions: tuple[Rung, ...]  # mandatory first, then dQ/dM descending
    start_bytes: int  # expert bytes at T
    budget_bytes: int  # 0 = none
    budget_rungs: int  # greedy demotions (after the mandatory ones) needed to fit the budget
    budget_feasible: bool  # False: floors and pins keep the bytes above the budget


def expert_importance(activity: ActivitySnapshot, cfg: PlannerConfig) -> np.ndarray:
    """[L, E] importance (module doc); demand counts only when requests run."""
    w_demand = cfg.weight_demand if activity.has_demand else 0.0
    weight_sum = cfg.weight_share + cfg.weight_prob + w_demand
    if weight_sum <= 0.0:  # only the demand weight is set and nothing runs
        mix = activity.routed_share
    else:
        mix = (
            cfg.weight_share * activity.routed_share
            + cfg.weight_prob * activity.prob_share
            + w_demand * activity.demand_share
        ) / weight_sum  # [L, E], rows sum to 1
    num_experts = activity.routed_share.shape[1]
    return num_experts * mix + cfg.importance_floor


def route_probability(activity: ActivitySnapshot, top_k: int) -> np.ndarray:
    """[L, E] chance that a token is routed to the expert."""
    return np.minimum(1.0, top_k * activity.routed_share)


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


def block_chain(shape: ModelShape, floor_bits: int) -> tuple[int, ...]:
    """Allowed bits of a block, descending: views >= floor, then 0 if allowed."""
    chain = tuple(v for v in reversed(shape.view_bits) if v >= floor_bits)
    return chain + (HOST_ONLY,) if floor_bits == HOST_ONLY else chain


class _RungCost:
    """dQ of a rung (module doc), closed over one PlanInputs."""

    def __init__(self, inputs: PlanInputs, cfg: PlannerConfig) -> None:
        self._shape = inputs.shape
        self._cost = inputs.sensitivity
        self._importance = expert_importance(inputs.activity, cfg)  # [L, E]
        self._stall_per_byte = route_probability(inputs.activity, inputs.shape.top_k) * (
            cfg.host_stall_cost_per_s / cfg.host_bandwidth_bytes_per_s
        )  # [L, E]

    def rung(self, layer: int, expert: int, proj: int, a: int, b: int) -> Rung:
        sens_a = self._cost.at(layer, expert, proj, a)
        sens_b = self._cost.at(layer, expert, proj, b)
        quality = float(self._importance[layer, expert]) * abs(sens_b - sens_a)
        if HOST_ONLY in (a, b):
            resident = self._shape.bytes_at(proj, max(a, b))
            quality += float(self._stall_per_byte[layer, expert]) * resident
        freed = self._shape.bytes_at(proj, a) - self._shape.bytes_at(proj, b)
        return Rung(layer, expert, proj, a, b, freed, quality)


def _ratio(rung: Rung) -> float:
    moved = abs(rung.bytes_delta)
    return rung.quality_delta / moved if moved > 0 else float("inf")


def greedy_walk(chains: list[list[Rung]], descending: bool) -> list[Rung]:
    """Merges per-block rung chains by dQ/dM (ascending, or descending for
    promotions) with a priority queue; a chain's rung is queued only after its
    predecessor is emitted. Ties break by (layer, expert, proj)."""
    sign = -1.0 if descending else 1.0
    heap: list[tuple[float, int, int, int, int, int]] = []
    for c, chain in enumerate(chains):
        if chain:
            r = chain[0]
            heapq.heappush(heap, (sign * _ratio(r), r.layer, r.expert, r.proj, c, 0))
    out: list[Rung] = []
    while heap:
        _, _, _, _, c, i = heapq.heappop(heap)
        out.append(chains[c][i])
        if i + 1 < len(chains[c]):
            r = chains[c][i + 1]
            heapq.heappush(heap, (sign * _ratio(r), r.layer, r.expert, r.proj, c, i + 1))
    return out


def _chains(cost: _RungCost, shape: ModelShape, start: np.ndarray, floors: np.ndarray,
            pins: np.ndarray, down: bool) -> list[list[Rung]]:
    """Per-block chains of single steps from start bits, down to the floor or
    up to the ceiling; pinned experts have none."""
    chains: list[list[Rung]] = []
    for layer in range(shape.num_layers):
        for expert in range(shape.num_experts):
            if pins[layer, expert] != NOT_PINNED:
                continue
            allowed = block_chain(shape, int(floors[layer, expert]))
            if not down:
                allowed = tuple(reversed(allowed))
            for proj in range(NUM_PROJECTIONS):
                bits = int(start[layer, expert, proj])
                if bits not in allowed:
                    continue
                path = allowed[allowed.index(bits):]
                chains.append([cost.rung(layer, expert, proj, a, b) for a, b in zip(path, path[1:])])
    return chains


def _apply(bits: np.ndarray, rungs: list[Rung]) -> np.ndarray:
    out = bits.copy()
    for r in rungs:
        out[r.layer, r.expert, r.proj] = r.to_bits
    return out


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
    cost = _RungCost(inputs, cfg)

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

    demotions = greedy_walk(_chains(cost, shape, target, floors, pins, down=True), descending=False)
    start_bytes = shape.expert_bytes(target)
    budget = inputs.constraints.budget_bytes
    budget_rungs, feasible, fitted_bytes = 0, True, start_bytes
    if budget > 0:
        while fitted_bytes > budget and budget_rungs < len(demotions):
            fitted_bytes -= demotions[budget_rungs].bytes_delta
            budget_rungs += 1
        feasible = fitted_bytes <= budget
    fitted = _apply(target, demotions[:budget_rungs])

    promotions = greedy_walk(_chains(cost, shape, fitted, floors, pins, down=False), descending=True)
    if budget > 0:
        room = budget - fitted_bytes
        kept = 0
        for r in promotions:
            if -r.bytes_delta > room:
                break
            room += r.bytes_delta
            kept += 1
        promotions = promotions[:kept]
    return Ladder(
        start_bits=target,
        demotions=tuple(mandatory_down + demotions),
        promotions=tuple(mandatory_up + promotions),
        start_bytes=start_bytes,
        budget_bytes=budget,
        budget_rungs=budget_rungs,
        budget_feasible=feasible,
    )
