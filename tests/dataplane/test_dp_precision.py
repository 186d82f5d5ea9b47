"""Paged experts in the engine: the precision controller trades expert bits for
KV room before any preemption, follows the controlplane's ladder, and restores
precision when room returns (dataplane/precision/)."""

from __future__ import annotations

import time

import pytest

from dataplane.engine_io import QueueSink
from dataplane.memory.arena import Arena
from dataplane.precision.controller import PrecisionController
from dataplane.precision.ladder import WalkLimits
from dataplane.sampling_params import SamplingParams
from dataplane.weights.codec import encode
from dataplane.weights.store import WeightStore
from pagedweight.v1 import common_pb2, telemetry_pb2

TIMEOUT_S = 60.0
# The session checkpoint's experts at 8 bits take 240 pages of 16 KiB (48
# blocks x 5 pages); each block can give back 4 pages by going to 2 bits.
WEIGHT_PAGES_8BIT = 240
SPARE_PAGES = 10


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def small_store(num_blocks: int = 6, pages: int = 64) -> tuple[WeightStore, Arena]:
    import torch

    gen = torch.Generator().manual_seed(0)
    arena = Arena(pages, 4096)
    blocks = [encode(torch.randn(64, 128, generator=gen)) for _ in range(num_blocks)]
    return WeightStore(arena, blocks, initial_bits=8), arena


def plan_step(block: int, from_bits: int, to_bits: int, cost: float, num_experts: int = 2):
    expert, proj = divmod(block, 3)
    layer, expert = divmod(expert, num_experts)
    return telemetry_pb2.PrecisionStep(
        block=common_pb2.BlockId(layer=layer, expert=expert, projection=proj + 1),
        from_bits=from_bits, to_bits=to_bits, quality_delta=cost,
    )


def test_reclaim_follows_the_plan_order_and_skips_stale_rungs():
    store, arena = small_store()
    clock = FakeClock()
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.5, 0.0, 0), clock=clock)
    plan = telemetry_pb2.PrecisionPlan(plan_id=7, demotions=[
        plan_step(4, 6, 4, 0.1),  # stale: block 4 is at 8 bits
        plan_step(5, 8, 6, 0.2),
        plan_step(1, 8, 2, 0.3),
    ])
    ctl.set_plan(plan)
    freed = ctl.reclaim(1)
    assert freed >= 1
    assert store.bits(5) == 6 and store.bits(4) == 8 and store.bits(1) == 8
    ctl.reclaim(1)
    assert store.bits(1) == 2
    assert ctl.plan_id == 7
    counters = ctl.take_counters()
    assert counters.demotions == 2 and counters.plan_id == 7
    assert counters.predicted_quality_cost == pytest.approx(0.5)
    assert ctl.take_counters().demotions == 0  # deltas, not totals
    assert ctl.block_bits() == store.block_bits()


def test_fallback_ladder_demotes_least_recently_used_first():
    store, arena = small_store()
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.5, 0.0, 0))
    store.recency.touch([0, 1, 2, 3, 4])  # block 5 is the least recently used
    ctl.reclaim(1)
    assert store.bits(5) == 6 and all(store.bits(b) == 8 for b in range(5))


def test_promotions_wait_for_residence_and_keep_the_high_watermark():
    store, arena = small_store(pages=40)
    clock = FakeClock()
    ctl = PrecisionController(store, arena, num_experts=2, defaults=WalkLimits(0.0, 0.2, 5.0, 0), clock=clock)
    while ctl.reclaim(1):  # everything down to 2 bits
        pass
    assert set(store.block_bits()) == {2}
    ctl.on_step()
    store.sync()
    assert set(store.block_bits()) == {2}, "promoted inside the residence time"
    clock.now = 10.0
    for _ in range(20):
        ctl.on_step()
        store.sync()
    assert any(b > 2 for b in store.block_bits())
    assert arena.free_pages > 0.2 * arena.num_pages - store.block_pages(0, 8)


def run_requests(engine, n: int, max_tokens: int) -> dict[str, list[int]]:
    sinks = {}
    for i in range(n):
        sinks[f"r{i}"] = sink = QueueSink()
        prompt = [(7 * i + j) % 400 + 10 for j in range(20)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), sink)
    return {rid: [t for o in sink.outputs(timeout=TIMEOUT_S) for t in o.new_token_ids] for rid, sink in sinks.items()}


@pytest.mark.parametrize("dynamic", [True, False])
def test_demotion_makes_room_for_kv_instead_of_preempting(make_engine, dynamic):
    engine = make_engine(
        expert_precision="paged",
        dynamic_precision=dynamic,
        max_arena_pages=WEIGHT_PAGES_8BIT + SPARE_PAGES,
        min_residence_ms=0,
    )
    assert engine.stats().arena.weight_pages_by_bits == {8: WEIGHT_PAGES_8BIT}
    outputs = run_requests(engine, n=6, max_tokens=40)
    assert all(len(tokens) == 40 for tokens in outputs.values())
    stats = engine.stats()
    if dynamic:
        assert stats.preemptions_total == 0
        assert any(bits < 8 for bits in stats.arena.weight_pages_by_bits)
    else:
        assert stats.preemptions_total > 0
        assert stats.arena.weight_pages_by_bits == {8: WEIGHT_PAGES_8BIT}


def test_precision_returns_when_load_falls(make_engine):
    engine = make_engine(
        expert_precision="paged", max_arena_pages=WEIGHT_PAGES_8BIT + SPARE_PAGES, min_residence_ms=0,
        low_watermark=0.0, high_watermark=0.02,
    )
    run_requests(engine, n=6, max_tokens=40)
    deadline = time.monotonic() + TIMEOUT_S
    while engine.stats().arena.weight_pages_by_bits.get(8, 0) < WEIGHT_PAGES_8BIT - 8:
        assert time.monotonic() < deadline, f"precision not restored: {engine.stats().arena}"
        time.sleep(0.05)
    arena = engine.stats().arena
    assert arena.free_pages >= 0.02 * arena.total_pages
