"""A model of the dataplane's ladder walk, for tests and policy studies.

It states the walking rules the planner assumes (the dataplane implements its
own; this model is the reference), over a byte-level memory model
free = pool - kv - expert weights:

* A rung applies only while its block is at the rung's from_bits (a stale
  rung is skipped). The plan's lists are complete (planner.py: every bits a
  block can hold has its next rung in each list), so the first applicable
  rung is always the plan's choice, whichever way the walk has moved.
* Pressure (free < low_watermark * pool, or expert bytes above the plan's
  memory budget): apply the first applicable demotion; repeat until the
  pressure is gone or nothing applies. Demotions never wait.
* Room (free > high_watermark * pool): apply the first applicable
  promotion, only while free stays >= high_watermark * pool after the step,
  the budget holds, and the promotion byte rate allows it (a token bucket of
  one second; a rate of 0 means no limit). A block demoted less than
  min_residence_ms ago is *resident*: when the first applicable promotion is
  a resident block's, the walk waits (nothing behind it climbs past it).
* Corrective rungs (PrecisionPlan.corrective_*): the pins below the current
  bits apply when the plan arrives; at the start of every step the
  corrective promotions apply in order while the free bytes cover them
  (no watermark, residence or byte rate), stopping at the first that does
  not fit. No demotion goes below the plan's floor_bits.

The gap between the watermarks plus the residence time are the hysteresis:
a load oscillating inside the band causes no transitions at all, and a block
goes back up at most once per residence time after a demotion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.convert import step_to_rung
from controlplane.planner import ModelShape, Rung
from pagedweight.v1 import telemetry_pb2

MS_PER_S = 1000.0
# The promotion token bucket holds this many seconds of the byte rate.
BUCKET_SECONDS = 1.0


@dataclass
class WalkStats:
    demotions: int = 0
    promotions: int = 0
    stalls: int = 0  # steps where KV did not fit and no demotion was left (preemption)

    @property
    def transitions(self) -> int:
        return self.demotions + self.promotions


class LadderWalker:
    """Walks one plan at a time over a simulated pool. Not thread-safe."""

    def __init__(self, shape: ModelShape, bits: np.ndarray, pool_bytes: int) -> None:
        self.shape = shape
        self.bits = np.array(bits, dtype=np.int64).reshape(shape.num_layers, shape.num_experts, 3)  # [L, E, 3]
        self.pool_bytes = pool_bytes
        self.weight_bytes = shape.expert_bytes(self.bits)
        self.quality_cost = 0.0  # sum of applied rung costs (TelemetryReport.predicted_quality_cost)
        self.stats = WalkStats()
        self._demoted_ms = np.full(self.bits.shape, -math.inf)  # [L, E, 3] last demotion time
        self._plan: telemetry_pb2.PrecisionPlan | None = None
        self._demotions: list[Rung] = []
        self._promotions: list[Rung] = []
        self._corrective: list[Rung] = []  # corrective promotions not applied yet, in plan order
        self._floors: np.ndarray | None = None  # [L, E, 3] the plan's floor_bits
        self._tokens = 0.0
        self._last_ms: float | None = None

    def set_plan(self, plan: telemetry_pb2.PrecisionPlan, now_ms: float = 0.0) -> None:
        """Adopts a plan. The simulation has no dataplane to take watermarks
        from, so the plan must set both (PlannerConfig low/high_watermark)."""
        unset = [f for f in ("low_watermark", "high_watermark") if not plan.HasField(f)]
        if unset:
            raise ValueError(f"the simulated plan leaves {', '.join(unset)} unset; the simulation needs both")
        self._plan = plan
        self._demotions = [step_to_rung(s) for s in plan.demotions]
        promotions = [step_to_rung(s) for s in plan.promotions]
        self._corrective = promotions[:plan.corrective_promotions]
        self._promotions = promotions[plan.corrective_promotions:]
        self._floors = (np.asarray(plan.floor_bits, dtype=np.int64).reshape(self.bits.shape)
                        if len(plan.floor_bits) == self.bits.size else None)  # [L, E, 3]
        self._tokens = float(plan.promotion_bytes_per_s) * BUCKET_SECONDS
        for r in self._demotions[:plan.corrective_demotions]:
            if self.bits[r.layer, r.expert, r.proj] > r.to_bits:
                self._set(r.layer, r.expert, r.proj, r.to_bits, now_ms)

    def _set(self, layer: int, expert: int, proj: int, bits: int, now_ms: float) -> None:
        """A direct (corrective) change of one block; its cost is not tracked."""
        old = int(self.bits[layer, expert, proj])
        self.weight_bytes += self.shape.bytes_at(proj, bits) - self.shape.bytes_at(proj, old)
        self.bits[layer, expert, proj] = bits
        if bits > old:
            self.stats.promotions += 1
        else:
            self._demoted_ms[layer, expert, proj] = now_ms
            self.stats.demotions += 1

    def _apply_corrective(self, now_ms: float, kv_bytes: int) -> None:
        while self._corrective:
            r = self._corrective[0]
            have = int(self.bits[r.layer, r.expert, r.proj])
            if have < r.to_bits:
                need = self.shape.bytes_at(r.proj, r.to_bits) - self.shape.bytes_at(r.proj, have)
                if need > self.free_bytes(kv_bytes):
                    return
                self._set(r.layer, r.expert, r.proj, r.to_bits, now_ms)
            self._corrective.pop(0)

    def _applies(self, r: Rung) -> bool:
        if self.bits[r.layer, r.expert, r.proj] != r.from_bits:
            return False
        below_floor = self._floors is not None and r.to_bits < self._floors[r.layer, r.expert, r.proj]
        return not (r.to_bits < r.from_bits and below_floor)

    def _apply(self, r: Rung, now_ms: float) -> None:
        self.bits[r.layer, r.expert, r.proj] = r.to_bits
        self.weight_bytes -= r.bytes_delta
        if r.bytes_delta > 0:
            self._demoted_ms[r.layer, r.expert, r.proj] = now_ms
            self.quality_cost += r.quality_delta
            self.stats.demotions += 1
        else:
            self.quality_cost -= r.quality_delta
            self.stats.promotions += 1
            self._tokens -= -r.bytes_delta

    def _next(self, demote: bool) -> Rung | None:
        """The first applicable rung of the list in the given direction."""
        return next((r for r in (self._demotions if demote else self._promotions) if self._applies(r)), None)

    def _resident(self, r: Rung, now_ms: float) -> bool:
        return now_ms - self._demoted_ms[r.layer, r.expert, r.proj] < self._plan.min_residence_ms

    def free_bytes(self, kv_bytes: int) -> int:
        return self.pool_bytes - kv_bytes - self.weight_bytes

    def step(self, now_ms: float, kv_bytes: int) -> None:
        """One engine step with kv_bytes of KV demand at time now_ms."""
        if self._plan is None:
            raise RuntimeError("no plan")
        plan = self._plan
        if self._last_ms is not None:
            elapsed_s = max(0.0, now_ms - self._last_ms) / MS_PER_S
            cap = plan.promotion_bytes_per_s * BUCKET_SECONDS
            self._tokens = min(cap, self._tokens + plan.promotion_bytes_per_s * elapsed_s)
        self._last_ms = now_ms
        low = plan.low_watermark * self.pool_bytes
        high = plan.high_watermark * self.pool_bytes
        budget = plan.memory_budget_bytes
        self._apply_corrective(now_ms, kv_bytes)

        def pressed() -> bool:
            return self.free_bytes(kv_bytes) < low or (budget > 0 and self.weight_bytes > budget)

        while pressed():
            rung = self._next(True)
            if rung is None:
                break
            self._apply(rung, now_ms)
        if self.free_bytes(kv_bytes) < 0:
            self.stats.stalls += 1
            return
        while self.free_bytes(kv_bytes) > high:
            rung = self._next(False)
            if rung is None or self._resident(rung, now_ms):
                break
            need = -rung.bytes_delta
            if self.free_bytes(kv_bytes) - need < high or (budget > 0 and self.weight_bytes + need > budget):
                break
            rate = plan.promotion_bytes_per_s
            if rate > 0 and self._tokens < min(need, rate * BUCKET_SECONDS):
                break
            self._apply(rung, now_ms)
