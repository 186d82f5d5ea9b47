"""PrecisionController: executes the precision ladder against the weight store.

Policy lives in the controlplane; this is the dataplane's fast local half of
it. It runs on the engine thread (the weight store is single-threaded):

* ``reclaim(n_pages)`` — the scheduler's hook, called before any preemption:
  demote along the ladder until ``n_pages`` are free or the ladder is spent;
* ``on_step()`` — called once per engine iteration: adopt a new plan, apply
  its corrective rungs (blocks below a floor or pin go up as soon as the
  arena has the free pages, ignoring the watermarks, the residence time and
  the byte rate; pinned blocks above their pin go down at once), demote
  while free pages are under the low watermark (before KV runs out), promote
  while they stay over the high watermark, within the residence time and the
  promotion byte rate (hysteresis against thrashing).

Both directions keep the ladder's order. Demotions never wait: the first
applicable rung is the cheapest quality per page, and taking a later one
because the block in front moved a moment ago strands other blocks at lower
bits (measured: 3-bit blocks beside 6-bit ones, 18-40 % above the plan's own
optimum at the same pages; benchmarks/NOTES.md, session 40). A promotion
waits while its block was demoted less than the residence time ago, and then
nothing behind it climbs past it (the same stranding the other way round).
So a block flips from a demotion back up at most once per residence time,
which bounds its transitions under any load.

No demotion ever takes a block below the plan's floor_bits. The ladder is
walked by RungWalkers (dataplane/precision/walker.py): amortized O(1) per
rung instead of a rescan from the top for every step.

The telemetry thread only calls ``set_plan`` (which converts and indexes the
plan there, off the decode loop) and the ``PrecisionReporter`` methods, which
read a snapshot guarded by a lock. When the controlplane is
away the last ladder stays in force (fail-static); before any plan arrives a
local fallback ladder (least recently used blocks first, one view at a time)
is used so the dataplane can still trade precision for KV on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from dataplane.memory.arena import Arena, OutOfPages
from dataplane.precision.ladder import Ladder, Rung, WalkLimits, ladder_from_plan
from dataplane.precision.walker import RungWalker
from dataplane.precision_state import PROJECTIONS, Footprint, PrecisionCounters
from dataplane.weights.layout import HOST_ONLY_BITS, VIEW_BITS
from dataplane.weights.store import WeightStore
from pagedweight.v1 import telemetry_pb2

DEFAULT_LIMITS = WalkLimits(
    low_watermark=0.05, high_watermark=0.15, min_residence_s=2.0, promotion_bytes_per_s=0
)
# At most this many promotions per engine step: promotions are background work
# and must not stall a decode step. Corrective promotions are not counted.
MAX_PROMOTIONS_PER_STEP = 4

log = logging.getLogger(__name__)


class _PreparedPlan(NamedTuple):
    """A plan converted and indexed off the engine thread (set_plan)."""

    ladder: Ladder
    floors: tuple[int, ...] | None  # the plan's floor_bits, None when absent or of the wrong size
    down: RungWalker
    up: RungWalker


class PrecisionController:
    """Walks a ladder of demotions/promotions over a WeightStore in an Arena."""

    def __init__(
        self,
        store: WeightStore,
        arena: Arena,
        num_experts: int,
        defaults: WalkLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.arena = arena
        self.num_experts = num_experts
        self.defaults = defaults
        self.clock = clock
        self._ladder: Ladder | None = None
        self._down: RungWalker | None = None  # walkers over the ladder (None: fallback ladder)
        self._up: RungWalker | None = None
        self._floors: tuple[int, ...] | None = None  # minimum bits per block, from the plan
        self._corrective_at = 0  # next corrective promotion to apply
        self._known_bits: list[int] = store.block_bits()  # what the walkers last saw
        self._incoming: _PreparedPlan | None = None
        self._demoted_at = [float("-inf")] * store.num_blocks  # clock of each block's last demotion
        self._bucket_bytes = 0.0
        self._bucket_at = clock()
        self._quality_cost = 0.0
        self._lock = threading.Lock()
        self._bits_snapshot = store.block_bits()
        self._counters_snapshot = replace(store.counters)
        self._reported = replace(store.counters)

    # -- inputs (any thread) ---------------------------------------------------
    def set_plan(self, plan: telemetry_pb2.PrecisionPlan) -> None:
        """Prepares a new plan and hands it to the engine thread (the
        telemetry client's callback). The preparation (converting the steps,
        indexing them for the walkers: 0.19 s for a Qwen1.5-MoE-sized plan on one
        CPU thread, benchmarks/results/plan_cost_cpu.json) runs here,
        not on the engine thread between decode steps. A plan that names
        blocks this model does not have, or bits it does not serve, is logged
        and dropped; the last ladder stays in force."""
        try:
            prepared = self._prepare(plan)
        except ValueError as exc:
            log.warning("plan %d dropped: %s", plan.plan_id, exc)
            return
        with self._lock:
            self._incoming = prepared

    def _prepare(self, plan: telemetry_pb2.PrecisionPlan) -> _PreparedPlan:
        """The ladder and its walkers; touches no store state (any thread)."""
        ladder = ladder_from_plan(plan, self.num_experts, self.defaults)
        num_blocks = self.store.num_blocks
        steps = (*ladder.demotions, *ladder.promotions, *ladder.corrective_promotions)
        outside = [r for r in steps if not 0 <= r.block < num_blocks]
        if outside:
            raise ValueError(f"{len(outside)} steps name blocks outside the model's {num_blocks}")
        known = {HOST_ONLY_BITS, *VIEW_BITS}
        unknown = sorted({b for r in steps for b in (r.from_bits, r.to_bits)} - known)
        if unknown:
            raise ValueError(f"steps with bits {unknown}; this dataplane serves {sorted(known)}")
        floors = ladder.floor_bits
        if floors is not None and len(floors) != num_blocks:
            log.warning("plan %d: floor_bits has %d entries for %d blocks; ignored",
                        ladder.plan_id, len(floors), num_blocks)
            floors = None
        down = RungWalker(ladder.demotions, self._demotion_applies, self._is_pending, self._ready_at,
                          self.clock)  # queried with honour_residence=False: demotions never wait
        up = RungWalker(ladder.promotions, self._promotion_applies, self._is_pending, self._ready_at, self.clock)
        return _PreparedPlan(ladder, floors, down, up)

    @property
    def limits(self) -> WalkLimits:
        return self._ladder.limits if self._ladder is not None else self.defaults

    @property
    def plan_id(self) -> int:
        return self._ladder.plan_id if self._ladder is not None else 0

    # -- engine-thread hooks -----------------------------------------------------
    def reclaim(self, n_pages: int) -> int:
        """Demotes along the ladder until ``n_pages`` more pages are free; returns pages freed."""
        self._adopt_plan()
        self._see_bits()
        start = self.arena.free_pages
        while self.arena.free_pages - start < n_pages:
            if not self._demote_next():
                break
        self._publish()
        return self.arena.free_pages - start

    def on_step(self) -> None:
        """Once per engine iteration: adopt plans, apply corrective rungs,
        keep free pages between the watermarks."""
        self._adopt_plan()
        self.store.poll()
        self._see_bits()
        self._apply_corrective_promotions()
        limits = self.limits
        total = self.arena.num_pages
        while self.arena.free_pages < limits.low_watermark * total:
            if not self._demote_next():
                break
        for _ in range(MAX_PROMOTIONS_PER_STEP):
            if not self._promote_next(limits, total):
                break
        self._publish()

    # -- plans and corrections -------------------------------------------------------
    def _adopt_plan(self) -> None:
        with self._lock:
            prepared, self._incoming = self._incoming, None
        if prepared is None:
            return
        self._ladder, self._floors, self._down, self._up = prepared
        self._corrective_at = 0
        for rung in self._ladder.corrective_demotions:  # pins below the current bits: at once
            if self.store.bits(rung.block) > rung.to_bits:
                self._demote(rung)

    def _apply_corrective_promotions(self) -> None:
        """Raises blocks to their floor or pin in plan order while the arena
        has the free pages; stops at the first that does not fit (it waits
        for pages, the next ones keep their order)."""
        corrective = self._ladder.corrective_promotions if self._ladder is not None else ()
        while self._corrective_at < len(corrective):
            rung = corrective[self._corrective_at]
            block = rung.block
            pending = self.store.pending_bits(block)
            if self.store.bits(block) >= rung.to_bits or (pending is not None and pending >= rung.to_bits):
                self._corrective_at += 1
                continue
            if pending is not None:
                return  # another promotion of the block is landing: retry next step
            have = self.store.bits(block)
            need = self.store.block_pages(block, rung.to_bits) - self.store.block_pages(block, have)
            if need > self.arena.free_pages:
                return
            try:
                self.store.promote(block, rung.to_bits)
            except OutOfPages:
                return
            self._quality_cost = max(0.0, self._quality_cost - rung.quality_delta)
            self._corrective_at += 1

    # -- the walk ------------------------------------------------------------------
    def _see_bits(self) -> None:
        """Tells the walkers about blocks whose bits changed since they last
        looked (promotions that landed, on-demand fetches)."""
        bits = self.store.block_bits()
        if self._down is not None and self._up is not None:
            for block, (old, new) in enumerate(zip(self._known_bits, bits)):
                if old != new:
                    self._down.block_changed(block)
                    self._up.block_changed(block)
        self._known_bits = bits

    def _changed(self, block: int) -> None:
        self._known_bits[block] = self.store.bits(block)
        if self._down is not None and self._up is not None:
            self._down.block_changed(block)
            self._up.block_changed(block)

    def _ready_at(self, block: int) -> float:
        """When the block may be promoted: the residence time after its last demotion."""
        return self._demoted_at[block] + self.limits.min_residence_s

    def _resident_long_enough(self, block: int) -> bool:
        return self.clock() >= self._ready_at(block)

    def _is_pending(self, block: int) -> bool:
        return self.store.pending_bits(block) is not None

    def _demotion_applies(self, rung: Rung) -> bool:
        if self.store.bits(rung.block) != rung.from_bits or rung.to_bits >= rung.from_bits:
            return False
        return self._floors is None or rung.to_bits >= self._floors[rung.block]

    def _promotion_applies(self, rung: Rung) -> bool:
        return self.store.bits(rung.block) == rung.from_bits and rung.to_bits > rung.from_bits

    def _demote(self, rung: Rung) -> None:
        self.store.demote(rung.block, rung.to_bits)
        self._demoted_at[rung.block] = self.clock()
        self._changed(rung.block)
        self._quality_cost += rung.quality_delta

    def _demote_next(self) -> bool:
        """Applies the first applicable demotion (module doc: demotions never
        wait); False when none is left."""
        if self._down is not None:
            rung = self._down.first(honour_residence=False)
            if rung is None:
                return False
            self._demote(rung)
            return True
        return self._fallback_demote()

    def _fallback_demote(self) -> bool:
        """No plan yet: the first applicable rung of the local fallback ladder."""
        for rung in self._fallback_demotions():
            if self.store.bits(rung.block) != rung.from_bits or rung.to_bits >= rung.from_bits:
                continue
            if self.store.pending_bits(rung.block) is not None:
                continue
            self._demote(rung)
            return True
        return False

    def _next_promotion(self) -> Rung | None:
        """The plan's best applicable promotion, None while its block is
        inside its residence time (module doc); without a plan, the first
        fallback promotion of a block that may climb."""
        if self._up is not None:
            rung = self._up.first(honour_residence=False)
            return rung if rung is not None and self._resident_long_enough(rung.block) else None
        for rung in self._fallback_promotions():
            block = rung.block
            if self.store.bits(block) != rung.from_bits or rung.to_bits <= rung.from_bits:
                continue
            if self.store.pending_bits(block) is not None or not self._resident_long_enough(block):
                continue
            return rung
        return None

    def _promote_next(self, limits: WalkLimits, total_pages: int) -> bool:
        """Applies the first promotion that keeps free pages above the high watermark."""
        self._refill_bucket(limits)
        rung = self._next_promotion()
        if rung is not None:
            block = rung.block
            need = self.store.block_pages(block, rung.to_bits) - self.store.block_pages(block, rung.from_bits)
            if self.arena.free_pages - need <= limits.high_watermark * total_pages:
                return False  # the best promotion does not fit: wait, do not skip ahead
            nbytes = need * self.arena.page_bytes
            if limits.promotion_bytes_per_s and nbytes > self._bucket_bytes:
                return False
            try:
                self.store.promote(block, rung.to_bits)
            except OutOfPages:
                return False
            self._bucket_bytes -= nbytes
            self._quality_cost = max(0.0, self._quality_cost - rung.quality_delta)
            return True
        return False

    def _refill_bucket(self, limits: WalkLimits) -> None:
        now = self.clock()
        rate = limits.promotion_bytes_per_s
        # A one-second bucket: bursts up to one second's worth of bytes.
        self._bucket_bytes = min(float(rate), self._bucket_bytes + (now - self._bucket_at) * rate)
        self._bucket_at = now

    # -- the fallback ladder (before any plan) ---------------------------------------
    def _fallback_demotions(self) -> list[Rung]:
        """No plan yet: highest-bit blocks first, least recently used first, one view down."""
        blocks = [b for b in range(self.store.num_blocks) if self.store.bits(b) > VIEW_BITS[0]]
        blocks = self.store.recency.lru_order(blocks)
        blocks.sort(key=lambda b: -self.store.bits(b))  # stable: LRU within equal bits
        out = []
        for b in blocks:
            bits = self.store.bits(b)
            out.append(Rung(b, bits, VIEW_BITS[VIEW_BITS.index(bits) - 1], 0.0))
        return out

    def _fallback_promotions(self) -> list[Rung]:
        """No plan yet: lowest-bit blocks first, most recently used first, one view up."""
        blocks = [
            b for b in range(self.store.num_blocks)
            if self.store.bits(b) != HOST_ONLY_BITS and self.store.bits(b) < VIEW_BITS[-1]
        ]
        blocks = list(reversed(self.store.recency.lru_order(blocks)))
        blocks.sort(key=lambda b: self.store.bits(b))
        return [Rung(b, self.store.bits(b), VIEW_BITS[VIEW_BITS.index(self.store.bits(b)) + 1], 0.0) for b in blocks]

    # -- reporting (PrecisionReporter; any thread) -----------------------------------
    def _publish(self) -> None:
        """Copies what the telemetry thread may read (the store itself is engine-thread only)."""
        bits = self.store.block_bits()
        counters = replace(self.store.counters)
        with self._lock:
            self._bits_snapshot = bits
            self._counters_snapshot = counters

    def supported_bits(self) -> list[int]:
        return list(VIEW_BITS)

    def footprints(self) -> list[Footprint]:
        return [
            Footprint(name, bits, self.store.footprint_bytes(proj, bits))
            for proj, name in enumerate(PROJECTIONS)
            for bits in (HOST_ONLY_BITS, *VIEW_BITS)
        ]

    def block_bits(self) -> list[int]:
        with self._lock:
            return list(self._bits_snapshot)

    def take_counters(self) -> PrecisionCounters:
        with self._lock:
            now, last = self._counters_snapshot, self._reported
            self._reported = now
            return PrecisionCounters(
                predicted_quality_cost=self._quality_cost,
                demotions=now.demotions - last.demotions,
                promotions=now.promotions - last.promotions,
                host_reads=now.host_reads - last.host_reads,
                host_read_bytes=now.host_read_bytes - last.host_read_bytes,
                plan_id=self.plan_id,
            )
