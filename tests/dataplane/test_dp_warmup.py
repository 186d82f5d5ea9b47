"""The start-up warm-up (dataplane/warmup.py): its rounds cover the prefill
sizes, every decode bucket and mixed steps; it runs through the engine and
leaves no trace in the counters or the routing window; the served dataplane
warms up before it reports SERVING."""

from __future__ import annotations

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.cuda_graphs import DecodeGraphs
from dataplane.engine_builder import build, build_engine
from dataplane.engine_io import QueueSink
from dataplane.kv_cache import blocks_for_tokens
from dataplane.sampling_params import SamplingParams
from dataplane.warmup import (BUCKET_DECODE_TOKENS, MIXED_DECODE_TOKENS, MIXED_PREFILL_STEPS, WarmupRound,
                              engine_warmup_rounds, warm_up, warmup_rounds)

TIMEOUT_S = 120


def _rounds(**overrides) -> list[WarmupRound]:
    limits = dict(buckets=(1, 2, 4, 8), max_running_seqs=8, max_batched_tokens=100, max_pending_requests=1024,
                  block_size=16, context_length=4096, kv_tokens=1 << 20)
    return warmup_rounds(**{**limits, **overrides})


def test_rounds_cover_prefill_sizes_buckets_and_mixed_steps() -> None:
    rounds = _rounds()
    prefills = [r.prompt_lengths for r in rounds if r.max_tokens == 1]
    assert prefills == [(1,), (2,), (4,), (8,), (16,), (32,), (64,), (100,)]  # doubling, then the whole budget
    buckets = [r for r in rounds if r.max_tokens == BUCKET_DECODE_TOKENS]
    assert [len(r.prompt_lengths) for r in buckets] == [1, 2, 4, 8]
    (mixed,) = [r for r in rounds if r.max_tokens == MIXED_DECODE_TOKENS]
    # The burst fills the running set and its prompts take several steps' budgets.
    assert len(mixed.prompt_lengths) == 8
    assert sum(mixed.prompt_lengths) >= MIXED_PREFILL_STEPS * 100 - 8


def test_rounds_respect_context_kv_room_and_pending_limit() -> None:
    rounds = _rounds(context_length=40, kv_tokens=48, max_pending_requests=3)
    for r in rounds:
        assert len(r.prompt_lengths) <= 3
        assert all(1 <= n <= 40 - 1 - MIXED_DECODE_TOKENS for n in r.prompt_lengths)
        assert all(n <= 48 for n in r.prompt_lengths)
    (mixed,) = [r for r in rounds if r.max_tokens == MIXED_DECODE_TOKENS]
    assert sum(n + MIXED_DECODE_TOKENS for n in mixed.prompt_lengths) <= 48
    assert len(rounds) == len(set(rounds))  # clamped duplicates dropped
    with pytest.raises(ValueError):
        _rounds(kv_tokens=0)


def _config(model: str, **overrides) -> DataplaneConfig:
    fields = dict(model_path=model, device="cpu", dtype="float32", cpu_arena_bytes=8 << 20, max_running_seqs=4,
                  max_batched_tokens=64, max_context_length=256, expert_precision="dense")
    return DataplaneConfig(**{**fields, **overrides})


def test_warm_up_runs_through_the_engine_and_leaves_no_counts(random_ckpt) -> None:
    engine = build_engine(_config(str(random_ckpt)))
    engine.start()
    try:
        rounds = engine_warmup_rounds(engine)
        report = warm_up(engine, rounds, TIMEOUT_S)
        assert report.requests == sum(len(r.prompt_lengths) for r in rounds) and report.rounds == len(rounds)
        # Every round is at least its prefill step and its tokens' decode steps.
        assert report.steps >= sum(r.max_tokens for r in rounds)
        stats = engine.stats()
        assert (stats.generated_tokens_total, stats.prompt_tokens_total, stats.steps_total,
                stats.finished_requests_total, stats.preemptions_total) == (0, 0, 0, 0, 0)
        assert stats.running_requests == stats.waiting_requests == stats.kv_blocks_used == 0
        routed, mass = engine.drain_routing()
        assert routed.sum() == 0 and mass.sum() == 0
        # A real request afterwards is served and counted alone.
        sink = QueueSink()
        engine.add_request("real", [5, 6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True), sink)
        outs = list(sink.outputs(timeout=TIMEOUT_S))
        assert outs[-1].completion_tokens == 3
        stats = engine.stats()
        assert stats.generated_tokens_total == 3 and stats.prompt_tokens_total == 4
        assert engine.drain_routing()[0].sum() > 0
    finally:
        engine.stop()


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter, which tests/conftest.py "
                           "turns on only without a GPU")
def test_warm_up_prepares_every_decode_bucket(random_ckpt) -> None:
    """With the static-buffer decode path (no capture on the CPU), every
    bucket's graph exists after the warm-up, before any real request."""
    built = build(_config(str(random_ckpt), expert_precision="paged", max_batched_tokens=32,
                          max_context_length=64))
    runner = built.engine.runner
    spec = runner.model.spec
    runner.graphs = DecodeGraphs(runner.model, runner.kv, spec.num_layers, spec.num_experts, 4,
                                 blocks_for_tokens(64, runner.kv.block_size), capture=False)
    runner.decode_kernels = True
    batches: list[int] = []  # rows of each decode step run through the graphs
    replay = runner.graphs.replay

    def counted_replay(rows, *args, **kwargs):
        batches.append(len(rows))
        return replay(rows, *args, **kwargs)

    runner.graphs.replay = counted_replay
    built.engine.start()
    try:
        warm_up(built.engine, engine_warmup_rounds(built.engine), TIMEOUT_S)
    finally:
        built.engine.stop()
    assert sorted(runner.graphs._graphs) == [1, 2, 4]
    # Each bucket round's requests decode together: a step of the whole bucket.
    assert {1, 2, 4} <= set(batches)


def test_served_dataplane_is_warm_when_it_reports_serving(random_ckpt) -> None:
    dataplane = Dataplane(_config(str(random_ckpt), warm_up=True))
    address = dataplane.start()
    try:
        assert dataplane.warmup is not None and dataplane.warmup.requests > 0
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                               timeout=TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert dataplane.engine.stats().generated_tokens_total == 0
    finally:
        dataplane.stop()


def test_warm_up_is_on_by_default_only_on_cuda(random_ckpt, monkeypatch) -> None:
    monkeypatch.delenv("PW_DATAPLANE_WARM_UP", raising=False)  # tests/conftest.py turns it off for the suite
    assert not _config(str(random_ckpt)).resolved_warm_up()
    assert _config(str(random_ckpt), device="cuda").resolved_warm_up()
    assert not _config(str(random_ckpt), device="cuda", warm_up=False).resolved_warm_up()
    monkeypatch.setenv("PW_DATAPLANE_WARM_UP", "false")
    assert not _config(str(random_ckpt), device="cuda").resolved_warm_up()
    assert _config(str(random_ckpt), device="cuda", warm_up=True).resolved_warm_up()


def test_a_failed_warm_up_stops_the_engine_and_serves_nothing(random_ckpt, monkeypatch) -> None:
    def failing_warm_up(engine, rounds, timeout_s, host_only=None):
        raise TimeoutError("warm-up round 0 got no output")

    monkeypatch.setattr("dataplane.app.warm_up", failing_warm_up)
    dataplane = Dataplane(_config(str(random_ckpt), warm_up=True))
    with pytest.raises(TimeoutError):
        dataplane.start()
    with pytest.raises(RuntimeError, match="stopped"):
        dataplane.engine.add_request("late", [1, 2], SamplingParams(max_tokens=1), QueueSink())
    assert dataplane.server.server.port == 0  # the gRPC server never bound
