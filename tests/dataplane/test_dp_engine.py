"""Engine in process: streaming, counters, preemption, reclaim, routing, errors."""

from __future__ import annotations

import time

import pytest
import torch

from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build_engine, plan_memory
from dataplane.engine_io import InvalidRequest, QueueFull, QueueSink, RequestOutput
from dataplane.sampling_params import SamplingParams
from dataplane.sequence import FinishReason

TIMEOUT_S = 60


def run(engine, prompts: dict[str, list[int]], params: SamplingParams) -> dict[str, list[RequestOutput]]:
    sinks = {}
    for rid, prompt in prompts.items():
        sinks[rid] = QueueSink()
        engine.add_request(rid, prompt, params, sinks[rid])
    return {rid: list(sink.outputs(timeout=TIMEOUT_S)) for rid, sink in sinks.items()}


def tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def prompts(n: int, base_len: int = 5) -> dict[str, list[int]]:
    return {f"r{i}": [(7 * i + j) % 400 + 10 for j in range(base_len + 3 * i)] for i in range(n)}


def test_streams_tokens_and_counts_them(make_engine):
    engine = make_engine()
    ps = prompts(5)
    outs = run(engine, ps, SamplingParams(max_tokens=6, ignore_eos=True))
    for rid, seq_outs in outs.items():
        assert [o.completion_tokens for o in seq_outs] == [1, 2, 3, 4, 5, 6]
        assert all(len(o.new_token_ids) == 1 for o in seq_outs)
        assert seq_outs[-1].finish_reason == FinishReason.LENGTH
        assert all(o.prompt_tokens == len(ps[rid]) for o in seq_outs)
    stats = engine.stats()  # published before the last outputs were delivered
    assert stats.generated_tokens_total == 30
    assert stats.prompt_tokens_total == sum(map(len, ps.values()))
    assert stats.kv_blocks_used == 0 and stats.running_requests == stats.waiting_requests == 0
    assert stats.arena.kv_pages == 0 and stats.arena.free_pages == stats.arena.total_pages
    assert stats.steps_total >= 6 and stats.aborted_requests_total == 0


def test_preemption_recomputes_without_changing_the_output(make_engine):
    ps = prompts(4, base_len=20)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    roomy = run(make_engine(), ps, params)
    # 8 blocks of 16 tokens for 4 sequences growing to 44..53 tokens: must preempt.
    tight_engine = make_engine(max_arena_pages=8)
    tight = run(tight_engine, ps, params)
    assert {r: tokens(o) for r, o in tight.items()} == {r: tokens(o) for r, o in roomy.items()}
    assert tight_engine.stats().preemptions_total > 0
    assert tight_engine.stats().kv_blocks_used == 0


def test_seeded_sampling_is_reproducible_across_batches_and_preemption(make_engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)
    prompt = {"x": list(range(30, 60))}
    alone = tokens(run(make_engine(), prompt, params)["x"])
    crowded = run(make_engine(max_arena_pages=7), {**prompts(3, base_len=20), **prompt}, params)
    assert tokens(crowded["x"]) == alone


def test_reclaim_callback_is_asked_before_preempting(make_engine):
    calls: list[int] = []
    engine = make_engine(reclaim_pages=lambda n: calls.append(n) or 0, max_arena_pages=8)
    run(engine, prompts(4, base_len=20), SamplingParams(max_tokens=24, ignore_eos=True))
    assert calls and all(n >= 1 for n in calls)
    assert engine.stats().preemptions_total > 0


def test_routing_window_and_running_demand(make_engine):
    engine = make_engine()
    info = engine.model_info
    engine.drain_routing()
    ps = prompts(3)
    run(engine, ps, SamplingParams(max_tokens=4, ignore_eos=True))
    routed, mass = engine.drain_routing()
    computed = sum(len(p) for p in ps.values()) + 3 * 3  # prompts + 3 decode steps each
    assert routed.shape == (info.num_layers, info.num_experts)
    assert routed.sum(dim=1).tolist() == [computed * info.top_k] * info.num_layers
    torch.testing.assert_close(mass.sum(dim=1), torch.full((info.num_layers,), float(computed), dtype=torch.float64))
    again, _ = engine.drain_routing()
    assert again.sum() == 0
    wait_for(lambda: engine.running_demand().sum() == 0, "demand to clear")
    sink = QueueSink()
    engine.add_request("long", list(range(10, 20)), SamplingParams(max_tokens=2000, ignore_eos=True), sink)
    sink.queue.get(timeout=TIMEOUT_S)  # running now
    # The engine folds a step into the demand while the next step runs
    # (Engine._flush_bookkeeping), so it shows up at most a step later.
    wait_for(lambda: engine.running_demand().sum() > 0, "demand of the running sequence")
    demand = engine.running_demand()
    # One running sequence: its mean routing distribution sums to 1 per layer.
    torch.testing.assert_close(demand.sum(dim=1), torch.ones(info.num_layers), atol=1e-4, rtol=0)
    engine.abort("long")
    wait_for(lambda: engine.running_demand().sum() == 0, "demand to clear after abort")


def test_a_finished_sequence_leaves_the_demand_while_others_run(make_engine):
    # The engine folds each step into the demand one step late; a sequence
    # that finished in that step must not come back with it.
    engine = make_engine()
    info = engine.model_info
    long_sink = QueueSink()
    engine.add_request("long", list(range(10, 20)), SamplingParams(max_tokens=2000, ignore_eos=True), long_sink)
    long_sink.queue.get(timeout=TIMEOUT_S)
    run(engine, {"short": list(range(30, 45))}, SamplingParams(max_tokens=2, ignore_eos=True))
    for _ in range(3):  # a few more steps of "long" alone
        long_sink.queue.get(timeout=TIMEOUT_S)
    # Only "long" is tracked: its mean routing distribution sums to 1 per layer.
    torch.testing.assert_close(engine.running_demand().sum(dim=1), torch.ones(info.num_layers), atol=1e-4, rtol=0)
    engine.abort("long")
    wait_for(lambda: engine.running_demand().sum() == 0, "demand to clear after abort")


def test_abort_ends_the_stream_and_frees_blocks(make_engine):
    engine = make_engine()
    sink = QueueSink()
    engine.add_request("a", list(range(10, 50)), SamplingParams(max_tokens=5000, ignore_eos=True), sink)
    first = sink.queue.get(timeout=TIMEOUT_S)
    assert first.new_token_ids and engine.stats().kv_blocks_used > 0
    engine.abort("a")
    rest = list(sink.outputs(timeout=TIMEOUT_S))
    assert rest[-1].finish_reason == FinishReason.ABORT
    assert engine.stats().kv_blocks_used == 0
    assert engine.stats().aborted_requests_total == 1


def test_bad_requests_are_refused_before_queueing(make_engine):
    engine = make_engine(max_context_length=64, max_pending_requests=1)
    ok = SamplingParams(max_tokens=3)
    cases = [
        ("", [1, 2], ok, "request_id"),
        ("a", [], ok, "empty"),
        ("a", list(range(64)), ok, "context length is 64"),
        ("a", [1, engine.model_info.vocab_size], ok, "outside the vocabulary"),
        ("a", [1], SamplingParams(temperature=-1.0), "temperature"),
        ("a", [1], SamplingParams(top_p=2.0), "top_p"),
        ("a", [1], SamplingParams(max_tokens=0), "max_tokens"),
    ]
    for rid, prompt, params, match in cases:
        with pytest.raises(InvalidRequest, match=match):
            engine.add_request(rid, prompt, params, QueueSink())
    sink = QueueSink()
    engine.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True), sink)
    with pytest.raises(InvalidRequest, match="already running"):
        engine.add_request("busy", [1], ok, QueueSink())
    with pytest.raises(QueueFull):
        engine.add_request("other", [1], ok, QueueSink())
    engine.abort("busy")
    list(sink.outputs(timeout=TIMEOUT_S))
    assert engine.stats().aborted_requests_total == 1  # published before the output
    engine.add_request("other", [1], ok, QueueSink())  # room again


def test_synthetic_model_serves_without_files():
    config = DataplaneConfig(synthetic="mixtral-tiny", cpu_arena_bytes=4 << 20)
    engine = build_engine(config)
    engine.start()
    try:
        assert engine.model_info.tokenizer_json == "" and engine.model_info.family == "mixtral"
        outs = run(engine, {"s": [1, 2, 3]}, SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(tokens(outs["s"])) == 4
    finally:
        engine.stop()


def test_memory_plan_subtracts_fixed_residents(random_ckpt):
    from dataplane.engine_builder import load_model

    base = DataplaneConfig(model_path=str(random_ckpt), workspace_bytes=1 << 20)
    device, dtype = torch.device("cpu"), torch.float32
    info, model = load_model(base, device, dtype)
    tensors = list(model.parameters()) + list(model.buffers())  # buffers: rotary inv_freq
    params = sum(t.numel() * t.element_size() for t in tensors)
    budget = params + (1 << 20) + 10 * 16384 + 100
    plan = plan_memory(base.model_copy(update={"memory_budget_bytes": budget}), model.spec, model, device, dtype)
    assert plan.param_bytes == params and plan.page_bytes == 16384 and plan.num_pages == 10
    with pytest.raises(ValueError, match="no room for KV"):
        plan_memory(base.model_copy(update={"memory_budget_bytes": params}), model.spec, model, device, dtype)
    default = plan_memory(base, model.spec, model, device, dtype)
    assert default.num_pages == base.cpu_arena_bytes // 16384


def test_memory_plan_pages_hold_the_widest_expert_tile(random_ckpt):
    # A KV block smaller than one 64-row tile of the widest expert field
    # (docs/WEIGHT_LAYOUT.md) still gets pages that hold the tile.
    from dataplane.engine_builder import load_model
    from dataplane.weights.layout import expert_tile_bytes

    base = DataplaneConfig(model_path=str(random_ckpt), workspace_bytes=1 << 20, kv_block_size=1)
    info, model = load_model(base, torch.device("cpu"), torch.float32)
    plan = plan_memory(base, model.spec, model, torch.device("cpu"), torch.float32)
    tile = expert_tile_bytes(model.spec.hidden_size, model.spec.intermediate_size)
    assert plan.page_bytes >= tile and plan.page_bytes & (plan.page_bytes - 1) == 0


def test_stop_aborts_unfinished_requests_and_refuses_new_ones(make_engine):
    engine = make_engine()
    sink = QueueSink()
    engine.add_request("long", [5, 6, 7], SamplingParams(max_tokens=100000, ignore_eos=True), sink)
    sink.queue.get(timeout=TIMEOUT_S)
    engine.stop()
    rest = list(sink.outputs(timeout=TIMEOUT_S))
    assert rest[-1].finish_reason == FinishReason.ABORT
    assert engine.stats().kv_blocks_used == 0
    with pytest.raises(RuntimeError, match="stopped"):
        engine.add_request("late", [1], SamplingParams(), QueueSink())


def test_residents_can_exclude_weights_that_move_to_the_arena(random_ckpt):
    from dataplane.engine_builder import load_model, resident_bytes

    _, model = load_model(DataplaneConfig(model_path=str(random_ckpt)), torch.device("cpu"), torch.float32)
    experts = sum(p.numel() * 4 for n, p in model.named_parameters() if ".experts." in n)
    assert experts > 0
    assert resident_bytes(model, exclude=lambda name: ".experts." in name) == resident_bytes(model) - experts
