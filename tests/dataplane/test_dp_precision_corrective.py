"""Corrective rungs and floors in the dataplane's precision controller: a
block below its floor or pin goes up as soon as the arena has the pages
(no high watermark, no residence, no byte rate); no demotion goes below a
floor; a pin below the current bits applies at once."""

from __future__ import annotations

import torch

from dataplane.memory.arena import KV_TAG, Arena
from dataplane.precision.controller import PrecisionController
from dataplane.precision.ladder import WalkLimits
from dataplane.weights.codec import encode
from dataplane.weights.store import WeightStore
from pagedweight.v1 import common_pb2, telemetry_pb2

NUM_EXPERTS = 2
NUM_BLOCKS = 6  # 1 layer x 2 experts x 3 projections
RESIDENCE_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(block: int, a: int, b: int, cost: float = 1.0) -> telemetry_pb2.PrecisionStep:
    expert, proj = divmod(block, 3)
    layer, expert = divmod(expert, NUM_EXPERTS)
    return telemetry_pb2.PrecisionStep(
        block=common_pb2.BlockId(layer=layer, expert=expert, projection=proj + 1), from_bits=a, to_bits=b,
        quality_delta=cost)


def setup(pages: int, high: float = 0.9, rate: int = 0) -> tuple[WeightStore, Arena, PrecisionController, Clock]:
    gen = torch.Generator().manual_seed(0)
    arena = Arena(pages, 4096)
    store = WeightStore(arena, [encode(torch.randn(64, 128, generator=gen)) for _ in range(NUM_BLOCKS)],
                        initial_bits=8)
    clock = Clock()
    ctl = PrecisionController(store, arena, NUM_EXPERTS, defaults=WalkLimits(0.0, high, RESIDENCE_S, rate),
                              clock=clock)
    return store, arena, ctl, clock


def all_to_two_bits(store: WeightStore, ctl: PrecisionController) -> None:
    while ctl.reclaim(1):  # fallback ladder; every block changes now (residence starts)
        pass
    assert set(store.block_bits()) == {2}


def plan(**fields) -> telemetry_pb2.PrecisionPlan:
    return telemetry_pb2.PrecisionPlan(plan_id=3, high_watermark=0.9, min_residence_ms=int(RESIDENCE_S * 1000),
                                       **fields)


def test_corrective_promotion_ignores_high_watermark_residence_and_rate():
    store, arena, ctl, clock = setup(pages=40, rate=1)  # a 1 B/s promotion rate: regular ones never fit
    all_to_two_bits(store, ctl)
    floors = [2] * NUM_BLOCKS
    floors[1] = 6
    ctl.set_plan(plan(promotions=[step(1, 2, 6, 0.5), step(2, 2, 3)], corrective_promotions=1,
                      floor_bits=floors, promotion_bytes_per_s=1))
    assert arena.free_pages < 0.9 * arena.num_pages  # under the high watermark: no regular promotion
    ctl.on_step()
    store.sync()
    assert store.bits(1) == 6  # at once, inside its residence time
    assert store.bits(2) == 2  # the regular promotion waits for room, residence and rate
    clock.now += 2 * RESIDENCE_S
    ctl.on_step()
    store.sync()
    assert store.bits(2) == 2


def test_corrective_promotion_waits_for_free_pages_then_applies():
    store, arena, ctl, clock = setup(pages=64)
    all_to_two_bits(store, ctl)
    need = store.block_pages(0, 8) - store.block_pages(0, 2)
    hog = arena.alloc(arena.free_pages - need + 1, KV_TAG)  # KV takes all but need - 1 pages
    ctl.set_plan(plan(promotions=[step(0, 2, 8)], corrective_promotions=1, floor_bits=[8] + [2] * 5))
    ctl.on_step()
    store.sync()
    assert store.bits(0) == 2 and arena.free_pages == need - 1
    arena.free(hog[:1])  # one page comes back
    ctl.on_step()
    store.sync()
    assert store.bits(0) == 8


def test_no_demotion_below_a_floor_or_pin():
    store, arena, ctl, clock = setup(pages=64)
    floors = [8, 6, 2, 2, 2, 2]
    ctl.set_plan(plan(demotions=[step(0, 8, 6), step(1, 8, 6), step(1, 6, 4), step(2, 8, 6)], floor_bits=floors))
    clock.now = 100.0
    while ctl.reclaim(1):
        pass
    assert store.block_bits() == [8, 6, 6, 8, 8, 8]


def test_pin_below_current_bits_applies_at_once():
    store, arena, ctl, clock = setup(pages=64)
    ctl.reclaim(1)  # one block changed just now: inside its residence time
    changed = next(b for b in range(NUM_BLOCKS) if store.bits(b) != 8)
    ctl.set_plan(plan(demotions=[step(changed, 6, 3), step(5, 8, 6)], corrective_demotions=1,
                      floor_bits=[3 if b == changed else 2 for b in range(NUM_BLOCKS)]))
    ctl.on_step()
    assert store.bits(changed) == 3
    assert store.bits(5) == 8 or changed == 5  # regular demotions still wait for pressure


def test_plan_floor_bits_of_the_wrong_size_are_ignored():
    store, arena, ctl, clock = setup(pages=64)
    ctl.set_plan(plan(demotions=[step(0, 8, 6)], floor_bits=[8, 8]))
    clock.now = 100.0
    ctl.reclaim(1)
    assert store.bits(0) == 6
