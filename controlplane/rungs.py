"""Rungs and their costs: the planner's primitives (model shape, one step of
one block, the quality cost of a step and of a state, per-block chains and
the greedy walk that merges them). The formulas are in controlplane/planner.py's
module doc. Pure functions, no I/O.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from controlplane.activity import ActivitySnapshot
from controlplane.config import PlannerConfig
from controlplane.sensitivity import BITS_AXIS, SensitivityTable
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
    return (num_experts * mix) ** cfg.importance_exponent + cfg.importance_floor


def route_probability(activity: ActivitySnapshot, top_k: int) -> np.ndarray:
    """[L, E] chance that a token is routed to the expert."""
    return np.minimum(1.0, top_k * activity.routed_share)

def block_chain(shape: ModelShape, floor_bits: int) -> tuple[int, ...]:
    """Allowed bits of a block, descending: views >= floor, then 0 if allowed."""
    chain = tuple(v for v in reversed(shape.view_bits) if v >= floor_bits)
    return chain + (HOST_ONLY,) if floor_bits == HOST_ONLY else chain


class RungCost:
    """dQ of a rung and of a whole state (module doc), closed over one PlanInputs."""

    def __init__(self, inputs: PlanInputs, cfg: PlannerConfig) -> None:
        self._shape = inputs.shape
        self._cost = inputs.sensitivity
        self.importance = expert_importance(inputs.activity, cfg)  # [L, E]
        lowest = BITS_AXIS.index(inputs.shape.view_bits[0])
        worst_cost = float(inputs.sensitivity.cost[..., lowest].sum())  # table units
        per_stall_s = cfg.host_stall_weight * worst_cost / cfg.reference_step_s  # table units per s/token
        self.host_only_overhead = per_stall_s * cfg.host_only_step_overhead_s  # table units, any block on the host
        route_prob = route_probability(inputs.activity, inputs.shape.top_k)  # [L, E] chance a token needs it
        self.price_batch = cfg.host_price_batch or max(1, round(inputs.activity.running_seqs))
        read_prob = 1.0 - (1.0 - route_prob) ** self.price_batch  # [L, E] chance a step reads the block
        self._stall_scale = per_stall_s * read_prob  # [L, E] table units per s of host reads
        self._read_latency_s = cfg.host_read_latency_s
        self._host_bw = cfg.host_bandwidth_bytes_per_s

    def stall(self, layer: int, expert: int, proj: int) -> float:
        """Cost of serving block (layer, expert, proj) from the host: each use
        reads its master view (bytes_at(ceiling)) over the host link."""
        read_s = self._read_latency_s + self._shape.bytes_at(proj, self._shape.ceiling_bits) / self._host_bw
        return float(self._stall_scale[layer, expert]) * read_s

    def rung(self, layer: int, expert: int, proj: int, a: int, b: int) -> Rung:
        weight = float(self.importance[layer, expert])
        sens_a = self._cost.at(layer, expert, proj, a)
        sens_b = self._cost.at(layer, expert, proj, b)
        if HOST_ONLY in (a, b):
            # Host-only is served at the master view, so leaving view v for
            # it can gain quality; its stall is what it costs. Clipped at 0:
            # a step that frees bytes and gains quality is free (rungs carry
            # costs >= 0).
            view, host = (sens_a, sens_b) if b == HOST_ONLY else (sens_b, sens_a)
            quality = max(0.0, weight * (host - view) + self.stall(layer, expert, proj))
        else:
            quality = weight * abs(sens_b - sens_a)
        freed = self._shape.bytes_at(proj, a) - self._shape.bytes_at(proj, b)
        return Rung(layer, expert, proj, a, b, freed, quality)

    def block_cost(self, layer: int, expert: int, proj: int, bits: int) -> float:
        """Predicted cost of one block at ``bits`` (the terms of state_cost)."""
        cost = float(self.importance[layer, expert]) * self._cost.at(layer, expert, proj, bits)
        return cost + (self.stall(layer, expert, proj) if bits == HOST_ONLY else 0.0)

    def convex_path(self, layer: int, expert: int, proj: int, path: Sequence[int]) -> tuple[int, ...]:
        """The bits of ``path`` (a block's walk, bytes monotone) on the lower
        convex hull of its (bytes, block_cost) points, in the path's order.

        Host-only is a block's cheapest state in bytes and, served at the
        master view, often cheaper in quality than its lowest views: walked
        one view at a time, a block would pay every view's loss before the
        host-only rung gains it back, and the greedy walk would rarely get
        there. On the hull each step costs more per byte than the one before
        (down) and the views that host-only beats are skipped.
        """
        points = sorted((self._shape.bytes_at(proj, b), self.block_cost(layer, expert, proj, b), b) for b in path)
        hull: list[tuple[int, float, int]] = []
        for p in points:
            while len(hull) >= 2 and _turn(hull[-2], hull[-1], p) <= 0.0:
                hull.pop()
            hull.append(p)
        kept = {b for _, _, b in hull}
        return tuple(b for b in path if b in kept)

    def state_cost(self, bits: np.ndarray) -> float:
        """Predicted cost of a whole state bits [L, E, 3] relative to all at
        the ceiling: importance-weighted table costs (a host-only block's is
        its bits-0 entry) plus the stall of host-only blocks."""
        idx = np.searchsorted(np.asarray(BITS_AXIS), bits)  # [L, E, 3] positions on the table's bits axis
        sens = np.take_along_axis(self._cost.cost, idx[..., None], axis=-1)[..., 0]  # [L, E, 3]
        total = float((self.importance[:, :, None] * sens).sum())
        for layer, expert, proj in zip(*np.nonzero(bits == HOST_ONLY)):
            total += self.stall(int(layer), int(expert), int(proj))
        return total


def _turn(o: tuple[int, float, int], a: tuple[int, float, int], b: tuple[int, float, int]) -> float:
    """> 0 when o -> a -> b turns counter-clockwise in the (bytes, cost) plane."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _ratio(rung: Rung) -> float:
    moved = abs(rung.bytes_delta)
    return rung.quality_delta / moved if moved > 0 else float("inf")


def greedy_walk(chains: list[list[Rung]], descending: bool) -> list[Rung]:
    """Merges per-block rung chains by dQ/dM (ascending, or descending for
    promotions) with a priority queue; a chain's rung is queued only after its
    predecessor is emitted. Ties break by (layer, expert, proj), ascending for
    demotions and descending for promotions, so that with convex costs the
    promotions undo the demotions last in, first out."""
    sign = -1 if descending else 1
    heap: list[tuple[float, int, int, int, int, int]] = []

    def push(c: int, i: int) -> None:
        r = chains[c][i]
        heapq.heappush(heap, (sign * _ratio(r), sign * r.layer, sign * r.expert, sign * r.proj, c, i))

    for c, chain in enumerate(chains):
        if chain:
            push(c, 0)
    out: list[Rung] = []
    while heap:
        _, _, _, _, c, i = heapq.heappop(heap)
        out.append(chains[c][i])
        if i + 1 < len(chains[c]):
            push(c, i + 1)
    return out


def chains(cost: RungCost, shape: ModelShape, start: np.ndarray, floors: np.ndarray,
           pins: np.ndarray, down: bool, returning: bool = False) -> list[list[Rung]]:
    """Per-block chains of single steps from start bits, down to the floor or
    up to the ceiling (a chain that can reach host-only: the steps of
    RungCost.convex_path); pinned experts have none. returning=True gives the
    other side instead: the steps that lead back to start bits from the far
    end (down: from the ceiling; up: from the floor), which a walk needs once
    it has moved a block past start the other way."""
    out: list[list[Rung]] = []
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
                at = allowed.index(bits)
                path = allowed[:at + 1] if returning else allowed[at:]
                if HOST_ONLY in path:  # a chain of views alone keeps every step
                    path = cost.convex_path(layer, expert, proj, path)
                out.append([cost.rung(layer, expert, proj, a, b) for a, b in zip(path, path[1:])])
    return out


def both_ways(cost: RungCost, shape: ModelShape, start: np.ndarray, floors: np.ndarray, pins: np.ndarray,
              down: bool, head: Sequence[Rung] = ()) -> list[Rung]:
    """The complete list of one direction from start: the greedy walk of the
    chains from start merged, by the same key, with the returning chains
    (chains(returning=True)), after ``head``; rungs equal to one in head are
    left out (the earlier copy always applies first). Every bits a block can
    hold between its floor and the ceiling then has its next rung in the
    list, so a walker that promoted or demoted a block under this plan can
    take it back at the price the plan gives that step; the rungs from start
    keep the order of the plain greedy walk."""
    merged = greedy_walk(chains(cost, shape, start, floors, pins, down)
                         + chains(cost, shape, start, floors, pins, down, returning=True), descending=not down)
    seen = {(r.layer, r.expert, r.proj, r.from_bits, r.to_bits) for r in head}
    return list(head) + [r for r in merged if (r.layer, r.expert, r.proj, r.from_bits, r.to_bits) not in seen]


def apply_rungs(bits: np.ndarray, rungs: list[Rung]) -> np.ndarray:
    out = bits.copy()
    for r in rungs:
        out[r.layer, r.expert, r.proj] = r.to_bits
    return out
