"""RungWalker answers exactly what a scan from the top would, in amortized
O(1) per rung; the controller walks a Mixtral-sized ladder in linear time."""

from __future__ import annotations

import random
import time

import pytest

from dataplane.precision.controller import PrecisionController
from dataplane.precision.ladder import Rung, WalkLimits, ladder_from_plan
from dataplane.precision.walker import RungWalker
from dataplane.weights.store import WeightCounters
from pagedweight.v1 import common_pb2, telemetry_pb2

VIEWS = (2, 3, 4, 6, 8)


class World:
    """Blocks' bits, in-flight promotions, residence, a clock."""

    def __init__(self, num_blocks: int, residence: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.bits = [8] * num_blocks
        self.pending: set[int] = set()
        self.changed = [float("-inf")] * num_blocks
        self.residence = residence
        self.now = 0.0

    def applicable(self, r: Rung) -> bool:
        return self.bits[r.block] == r.from_bits and r.to_bits < r.from_bits

    def ready_at(self, block: int) -> float:
        return self.changed[block] + self.residence

    def reference(self, rungs, honour: bool) -> Rung | None:
        """The old controller's rule: a scan from the top."""
        for r in rungs:
            if not self.applicable(r) or r.block in self.pending:
                continue
            if honour and self.ready_at(r.block) > self.now:
                continue
            return r
        return None


def random_ladder(rng: random.Random, num_blocks: int, n: int) -> list[Rung]:
    """Mostly well-formed chains, shuffled across blocks, plus stale and direct rungs."""
    rungs = []
    for b in range(num_blocks):
        path = [8] + sorted(rng.sample(VIEWS[:-1], rng.randint(1, 4)), reverse=True)
        rungs += [Rung(b, a, c, 1.0) for a, c in zip(path, path[1:])]
    while len(rungs) < n:
        a = rng.choice(VIEWS[1:])
        rungs.append(Rung(rng.randrange(num_blocks), a, rng.choice([v for v in VIEWS if v < a]), 1.0))
    keyed = sorted(((rng.random(), i, r) for i, r in enumerate(rungs)), key=lambda t: t[:2])
    order = {b: [r for _, _, r in keyed if r.block == b] for b in range(num_blocks)}
    # keep each block's rungs in their relative order (as the planner emits them)
    out, seen = [], {b: 0 for b in range(num_blocks)}
    for _, _, r in keyed:
        out.append(order[r.block][seen[r.block]])
        seen[r.block] += 1
    return out


@pytest.mark.parametrize("seed", range(8))
def test_walker_matches_a_scan_from_the_top(seed):
    world = World(num_blocks=12, residence=2.0, seed=seed)
    rng = world.rng
    rungs = random_ladder(rng, 12, 60)
    walker = RungWalker(rungs, world.applicable, lambda b: b in world.pending, world.ready_at, lambda: world.now)
    for _ in range(400):
        honour = rng.random() < 0.7
        got = walker.first(honour_residence=honour)
        assert got == world.reference(rungs, honour)
        event = rng.random()
        if got is not None and event < 0.5:  # apply the answer
            world.bits[got.block] = got.to_bits
            world.changed[got.block] = world.now
            walker.block_changed(got.block)
        elif event < 0.65:  # a promotion lands (outside the walker's knowledge until told)
            b = rng.randrange(12)
            world.bits[b] = rng.choice([v for v in VIEWS if v >= world.bits[b]] or [8])
            world.changed[b] = world.now
            world.pending.discard(b)
            walker.block_changed(b)
        elif event < 0.75:  # a promotion starts / finishes without a bits change
            b = rng.randrange(12)
            world.pending ^= {b}
        else:  # time passes
            world.now += rng.choice([0.0, 0.5, 1.0, 3.0])


# -- the controller on a huge ladder ---------------------------------------------------------

class FakeArena:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.free_pages = 0
        self.page_bytes = 4096


class FakeStore:
    """The WeightStore surface the controller uses; a block takes `bits` pages."""

    def __init__(self, arena: FakeArena, num_blocks: int) -> None:
        self.arena = arena
        self.num_blocks = num_blocks
        self._bits = [8] * num_blocks
        self._pending: dict[int, int] = {}
        self.counters = WeightCounters()

    def bits(self, block: int) -> int:
        return self._bits[block]

    def block_bits(self) -> list[int]:
        return list(self._bits)

    def pending_bits(self, block: int) -> int | None:
        return self._pending.get(block)

    def block_pages(self, block: int, bits: int) -> int:
        return bits

    def demote(self, block: int, bits: int) -> int:
        self.arena.free_pages += self._bits[block] - bits
        self._bits[block] = bits
        self.counters.demotions += 1
        return 0

    def promote(self, block: int, bits: int) -> int:
        self.arena.free_pages -= bits - self._bits[block]
        self._pending[block] = bits
        return 0

    def poll(self) -> int:
        for block, bits in self._pending.items():
            self._bits[block] = bits
        done = len(self._pending)
        self._pending.clear()
        return done

    def footprint_bytes(self, proj: int, bits: int) -> int:
        return bits * 4096


def step(block: int, a: int, b: int, num_experts: int) -> telemetry_pb2.PrecisionStep:
    expert, proj = divmod(block, 3)
    layer, expert = divmod(expert, num_experts)
    return telemetry_pb2.PrecisionStep(
        block=common_pb2.BlockId(layer=layer, expert=expert, projection=proj + 1), from_bits=a, to_bits=b,
        quality_delta=1.0)


@pytest.mark.parametrize("residence_s", [0.0, 60.0])
def test_controller_walks_a_huge_ladder_in_linear_time(residence_s):
    # 24,576 blocks (a Mixtral-8x7B-sized model: 32 layers x 8 experts x 3 ... x 32) and
    # 73,728 rungs, level by level as the planner orders a uniform table: a rescan
    # per demotion would take ~2.7e9 rung checks.
    num_experts, num_blocks = 256, 24_576
    arena = FakeArena(num_pages=8 * num_blocks)
    store = FakeStore(arena, num_blocks)
    clock = [0.0]
    ctl = PrecisionController(store, arena, num_experts=num_experts,
                              defaults=WalkLimits(0.0, 0.5, residence_s, 0), clock=lambda: clock[0])
    levels = [(8, 6), (6, 4), (4, 3)]
    plan = telemetry_pb2.PrecisionPlan(plan_id=1, min_residence_ms=int(residence_s * 1000) or 0, demotions=[
        step(b, a, c, num_experts) for a, c in levels for b in range(num_blocks)])
    ctl.set_plan(plan)
    started = time.perf_counter()
    freed = ctl.reclaim(10 ** 9)  # more than the whole ladder frees
    elapsed = time.perf_counter() - started
    assert freed == num_blocks * (8 - 3)
    assert set(store.block_bits()) == {3}
    assert elapsed < 30.0, f"walking {len(plan.demotions)} rungs took {elapsed:.1f} s"


def test_controller_keeps_the_plan_order_with_residence():
    """Demotions never wait: a block demoted a moment ago still takes its
    next rung when that rung is first in the ladder."""
    arena = FakeArena(num_pages=100)
    store = FakeStore(arena, 6)
    clock = [0.0]
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.5, 5.0, 0),
                              clock=lambda: clock[0])
    ctl.set_plan(telemetry_pb2.PrecisionPlan(plan_id=1, min_residence_ms=5000, demotions=[
        step(0, 8, 6, 2), step(0, 6, 4, 2), step(1, 8, 6, 2), step(0, 4, 3, 2)]))
    order = []
    for _ in range(4):
        before = store.block_bits()
        ctl.reclaim(1)
        order += [(b, before[b], store.bits(b)) for b in range(6) if before[b] != store.bits(b)]
    assert order == [(0, 8, 6), (0, 6, 4), (1, 8, 6), (0, 4, 3)]


def test_promotions_wait_for_the_best_rung_instead_of_climbing_past_it():
    """The best promotion's block was demoted inside the residence time: the
    controller waits for it rather than promote a block behind it."""
    arena = FakeArena(num_pages=100)
    store = FakeStore(arena, 6)
    clock = [0.0]
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.1, 5.0, 0),
                              clock=lambda: clock[0])
    ctl.set_plan(telemetry_pb2.PrecisionPlan(plan_id=1, min_residence_ms=5000,
                                             demotions=[step(1, 8, 6, 2), step(0, 8, 6, 2), step(0, 6, 4, 2)],
                                             promotions=[step(0, 4, 6, 2), step(0, 6, 8, 2), step(1, 6, 8, 2)]))
    clock[0] = 1.0
    ctl.reclaim(1)  # block 1: 8 -> 6 at t = 1
    clock[0] = 4.0
    ctl.reclaim(3)  # block 0: 8 -> 6 -> 4 at t = 4
    assert (store.bits(0), store.bits(1)) == (4, 6)
    arena.free_pages = 80  # the load is gone: room for every promotion
    clock[0] = 6.5  # block 1 may climb, block 0 (first in line) may not yet
    ctl.on_step()
    store.poll()
    assert (store.bits(0), store.bits(1)) == (4, 6)
    clock[0] = 9.5
    for _ in range(3):
        ctl.on_step()
        store.poll()
    assert (store.bits(0), store.bits(1)) == (8, 8)


def test_plan_limits_set_to_zero_are_kept_and_unset_ones_fall_back():
    defaults = WalkLimits(0.05, 0.15, 2.0, 1000)
    zero = telemetry_pb2.PrecisionPlan(plan_id=1, low_watermark=0.0, high_watermark=0.0, min_residence_ms=0,
                                       promotion_bytes_per_s=0)
    assert ladder_from_plan(zero, 2, defaults).limits == WalkLimits(0.0, 0.0, 0.0, 0)
    unset = telemetry_pb2.PrecisionPlan(plan_id=2, high_watermark=0.3)
    assert ladder_from_plan(unset, 2, defaults).limits == WalkLimits(0.05, 0.3, 2.0, 1000)


def test_a_plan_naming_unknown_blocks_or_bits_is_dropped_and_the_last_one_stays():
    arena = FakeArena(num_pages=100)
    store = FakeStore(arena, 6)  # 2 experts x 1 layer x 3 projections
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.5, 0.0, 0))
    ctl.set_plan(telemetry_pb2.PrecisionPlan(plan_id=1, demotions=[step(4, 8, 6, 2)]))
    ctl.set_plan(telemetry_pb2.PrecisionPlan(plan_id=2, demotions=[step(9, 8, 6, 2)]))  # layer 1 does not exist
    ctl.set_plan(telemetry_pb2.PrecisionPlan(plan_id=3, demotions=[step(4, 8, 5, 2)]))  # no 5-bit view
    assert ctl.reclaim(1) == 2 and store.bits(4) == 6
    assert ctl.plan_id == 1
