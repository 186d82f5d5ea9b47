"""Decode steps through the static-buffer graph path (dataplane/cuda_graphs.py)
and the Triton decode attention, against the plain eager path.

On the CPU the graph path runs its static-buffer step eagerly (capture=False)
and the kernels run in Triton's interpreter; the GPU test at the end captures
and replays real CUDA graphs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dataplane.config import DataplaneConfig
from dataplane.cuda_graphs import VIEW_ALIGN_BYTES, DecodeGraphs, DecodeRows, _Inputs, batch_buckets
from dataplane.engine_builder import build
from dataplane.engine_io import QueueSink
from dataplane.kv_cache import blocks_for_tokens
from dataplane.routing_stats import RoutingStats
from dataplane.sampling_params import SamplingParams, StructuredOutput
from dataplane.weights.layout import NUM_PROJ, block_index
MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
PROMPTS = [[5, 17, 99, 4, 23, 61, 7], [300, 12, 9], list(range(44, 62))]
NEW_TOKENS = 6
MAX_BATCH = 4  # 3 prompts -> bucket 4: one padding row
# float32 on the GPU: Triton's tl.dot rounds fp32 operands to TF32 (10 bits of mantissa), and the
# graph and eager paths reach the logits through different launches; the H200 showed 1.2e-3.
TF32_LOGPROB_ATOL = 5e-3


def test_batch_buckets() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(5) == (1, 2, 4, 5)
    assert batch_buckets(64)[-1] == 64 and 16 in batch_buckets(64)
    with pytest.raises(ValueError):
        batch_buckets(0)


def test_routing_stats_token_weight_excludes_rows() -> None:
    ids = torch.tensor([[0, 2], [1, 2], [0, 2]])  # [T=3, k=2]
    probs = torch.tensor([[0.5, 0.1, 0.4], [0.1, 0.6, 0.3], [0.5, 0.1, 0.4]])  # [T, E]
    stats = RoutingStats(1, 3, torch.tensor([0, 1, 2]), 3, token_weight=torch.tensor([1, 1, 0]))
    stats.record(0, ids, probs)
    assert stats.routed_tokens[0].tolist() == [1, 1, 2]
    assert torch.allclose(stats.prob_mass[0], probs[:2].sum(0))
    assert stats.seq_prob_sum[2].abs().sum() == 0
    stats.reset()
    assert stats.routed_tokens.sum() == 0


def test_routing_stats_are_views_of_one_buffer() -> None:
    # One fill zeroes them and one copy takes them to the host (step_records.HostStats).
    stats = RoutingStats(3, 5, torch.tensor([0, 1]), 2)
    stats.record(1, torch.tensor([[0, 4], [4, 2]]), torch.full((2, 5), 0.25))
    routed, mass, seq = stats.views(stats.buffer.clone())
    assert routed.tolist()[1] == [1, 0, 1, 0, 2] and not routed[0].any() and not routed[2].any()
    assert mass.tolist()[1] == [0.5] * 5 and seq[:, 1].tolist() == [[0.25] * 5] * 2 and not seq[:, 0].any()
    assert torch.equal(routed, stats.routed_tokens) and torch.equal(mass, stats.prob_mass)
    assert torch.equal(seq, stats.seq_prob_sum)
    for view in (stats.routed_tokens, stats.prob_mass, stats.seq_prob_sum):
        assert view.untyped_storage().data_ptr() == stats.buffer.untyped_storage().data_ptr()
        assert (view.data_ptr() - stats.buffer.data_ptr()) % 16 == 0
    stats.reset()
    assert not stats.buffer.any()


def _config(**kw) -> DataplaneConfig:
    return DataplaneConfig(model_path=str(MODEL), max_running_seqs=MAX_BATCH, max_batched_tokens=256,
                           max_context_length=256, **kw)


def _generate(engine, tag: str) -> list[list[int]]:
    return [tokens for tokens, _ in _generate_with_logprobs(engine, tag, None)]


def _generate_with_logprobs(engine, tag: str, logprobs: int | None) -> list[tuple[list[int], list]]:
    """(tokens, their TokenLogprobs) per prompt, greedy."""
    sinks = []
    for i, prompt in enumerate(PROMPTS):
        sink = QueueSink()
        params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=logprobs)
        engine.add_request(f"{tag}-{i}", prompt, params, sink)
        sinks.append(sink)
    results = []
    for sink in sinks:
        outs = list(sink.outputs(timeout=300))
        results.append(([t for out in outs for t in out.new_token_ids], [e for out in outs for e in out.new_logprobs]))
    return results


def _assert_same_logprobs(got: list, want: list, atol: float) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.logprob == pytest.approx(b.logprob, abs=atol)
        assert len(a.top_token_ids) == len(b.top_token_ids)
        assert list(a.top_logprobs) == pytest.approx(list(b.top_logprobs), abs=atol)


def _with_static_decode(built) -> DecodeGraphs:
    """Routes the engine's decode steps through the static-buffer path (no capture on the CPU)."""
    runner = built.engine.runner
    spec = runner.model.spec
    graphs = DecodeGraphs(runner.model, runner.kv, spec.num_layers, spec.num_experts, MAX_BATCH,
                          blocks_for_tokens(256, runner.kv.block_size), capture=False)
    runner.graphs = graphs
    runner.decode_kernels = True
    return graphs


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter, which tests/conftest.py "
                           "turns on only without a GPU (the GPU test below covers this machine)")
def test_static_decode_path_matches_eager_on_cpu() -> None:
    eager = build(_config(device="cpu", dtype="float32"))
    static = build(_config(device="cpu", dtype="float32"))
    graphs = _with_static_decode(static)
    results = []
    for built, tag in ((eager, "e"), (static, "s")):
        built.engine.start()
        try:
            results.append((_generate(built.engine, tag), built.engine.drain_routing()[0]))
        finally:
            built.engine.stop()
    (want, routed_eager), (got, routed_static) = results
    assert got == want
    assert graphs.replays >= NEW_TOKENS - 1  # every decode step after the prefills
    assert 4 in graphs._graphs  # batches of 3 padded to the bucket of 4
    # Padding rows are not counted: each computed token routes top_k times per layer.
    top_k = static.engine.runner.model.spec.top_k
    tokens = sum(len(p) for p in PROMPTS) + len(PROMPTS) * (NEW_TOKENS - 1)
    assert routed_static.sum(dim=1).tolist() == [tokens * top_k] * routed_static.shape[0]
    assert torch.equal(routed_static, routed_eager)


def test_decode_rows_refuses_prefill_steps() -> None:
    built = build(_config(device="cpu", dtype="float32"))
    graphs = _with_static_decode(built)
    assert not graphs.can_replay(DecodeRows([], [], [], []))
    too_long = DecodeRows([1], [0], [0], [[0] * (graphs.max_blocks + 1)])
    assert not graphs.can_replay(too_long)
    assert graphs.can_replay(DecodeRows([1], [0], [0], [[0]]))
    # A host-only block does not: the kernels read it in place from the host.
    store = built.precision.store
    store.set_host_only(0)
    assert graphs.can_replay(DecodeRows([1], [0], [0], [[0]]))


def test_runner_touches_routed_experts_after_a_step() -> None:
    """The fused paths (and graph replays) skip per-layer host work; the runner
    records LRU accesses from the step's routing counts instead."""
    built = build(_config(device="cpu", dtype="float32"))
    runner, store = built.engine.runner, built.precision.store
    spec = runner.model.spec
    routed = torch.zeros(spec.num_layers, spec.num_experts, dtype=torch.int64)  # [layers, experts]
    routed[1, 3] = 2
    before = store.recency.clock
    runner.touch_routed(routed)
    hit = [block_index(1, 3, p, spec.num_experts) for p in range(NUM_PROJ)]
    assert all(store.recency.last_access(b) > before for b in hit)
    others = set(range(store.num_blocks)) - set(hit)
    assert all(store.recency.last_access(b) <= before for b in others)
    assert store.counters.host_reads == 0
    store.set_host_only(hit[2])  # the routed expert's down block, now read from the host
    runner.touch_routed(routed)
    assert store.counters.host_reads == 1 and store.counters.host_read_bytes == store.masters.master_bytes(hit[2])


def _demote_mixed(built) -> None:
    """Every block down to a bitwidth that depends on the block: 6, 4, 3, 2 bits mixed in each layer."""
    store = built.precision.store
    for blk in range(store.num_blocks):
        store.demote(blk, (6, 4, 3, 2)[blk % 4])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_decode_matches_eager_on_gpu() -> None:
    """Same greedy tokens with and without graphs, at 8 bits, after demoting
    in place to mixed bits (the captured graphs must read the new tables),
    and with every fifth block host-only: read in place from pinned host
    memory, the same tokens as those blocks resident at their master view."""
    outs = []
    with_logprobs = []
    for graphs_on in (False, True):
        built = build(_config(device="cuda", dtype="float32", cuda_graphs=graphs_on, max_arena_pages=512,
                              dynamic_precision=False))
        built.engine.start()
        try:
            at_8 = _generate(built.engine, f"g{graphs_on}")
            # Log-probabilities from the graph's device picks (every row asks) and the eager path.
            with_logprobs.append(_generate_with_logprobs(built.engine, f"l{graphs_on}", 3))
            _demote_mixed(built)
            mixed = _generate(built.engine, f"m{graphs_on}")
            store = built.precision.store
            on_host = list(range(0, store.num_blocks, 5))
            built.engine.run_on_engine_thread(lambda: [store.set_host_only(b) for b in on_host])
            host = _generate(built.engine, f"h{graphs_on}")
            assert store.counters.host_reads > 0

            def master_resident() -> None:
                for b in on_host:
                    store.promote(b, 8)
                store.sync()

            built.engine.run_on_engine_thread(master_resident)
            assert _generate(built.engine, f"r{graphs_on}") == host
        finally:
            built.engine.stop()
        outs.append((at_8, mixed, host))
        if graphs_on:
            graphs = built.engine.runner.graphs
            assert graphs is not None and graphs.captures >= 1 and graphs.replays >= 3 * (NEW_TOKENS - 1)
    assert outs[0] == outs[1]
    assert outs[0][0] != outs[0][1]  # the demotion changed the model
    for (tokens_eager, eager), (tokens_graph, graph) in zip(*with_logprobs):
        assert tokens_graph == tokens_eager
        assert len(graph) == NEW_TOKENS
        _assert_same_logprobs(graph, eager, atol=TF32_LOGPROB_ATOL)


def _run(engine, requests: list[tuple[list[int], SamplingParams]], tag: str, logprobs: list | None = None):
    """(tokens, finish reason) per request; each request's TokenLogprobs are
    appended to `logprobs` when given."""
    sinks = []
    for i, (prompt, params) in enumerate(requests):
        sinks.append(QueueSink())
        engine.add_request(f"{tag}-{i}", prompt, params, sinks[-1])
    results = []
    for sink in sinks:
        outs = list(sink.outputs(timeout=300))
        results.append(([t for out in outs for t in out.new_token_ids], outs[-1].finish_reason))
        if logprobs is not None:
            logprobs.append([e for out in outs for e in out.new_logprobs])
    return results


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter (the GPU test covers the GPU)")
def test_steps_launched_ahead_give_the_eager_tokens_on_cpu() -> None:
    """Overlapped decode (each step queued before the previous one is collected)
    against one step at a time and the eager path: same tokens and finish
    reasons when sequences stop on a token (its row of the step queued behind
    is dropped) or on max_tokens mid-batch, greedy or drawn."""
    plain = build(_config(device="cpu", dtype="float32", overlap_steps=False))
    plain.engine.start()
    try:
        free_run = _run(plain.engine, [(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in PROMPTS], "f")
    finally:
        plain.engine.stop()
    stop = free_run[1][0][2]  # request 1 stops on its third token
    requests = [
        (PROMPTS[0], SamplingParams(max_tokens=5, ignore_eos=True, logprobs=2)),
        (PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=[stop])),
        # Drawn tokens: one draw from the request's generator per step, queued or not.
        (PROMPTS[2], SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.9, top_p=0.9, seed=5, logprobs=0)),
    ]
    eager = build(_config(device="cpu", dtype="float32", overlap_steps=False))
    eager.engine.start()
    want_logprobs: list = []
    try:
        want = _run(eager.engine, requests, "e", want_logprobs)
    finally:
        eager.engine.stop()
    results = []
    for overlap in (False, True):
        built = build(_config(device="cpu", dtype="float32", overlap_steps=overlap))
        _with_static_decode(built)
        built.engine.start()
        got_logprobs: list = []
        try:
            results.append(_run(built.engine, requests, f"o{overlap}", got_logprobs))
        finally:
            built.engine.stop()
        # The device picks' log-probabilities (rows that asked, in a batch with one that did not).
        assert [len(entries) for entries in got_logprobs] == [5, 0, 7]
        for got, want_entries in zip(got_logprobs, want_logprobs):
            _assert_same_logprobs(got, want_entries, atol=1e-4)
        if overlap:
            assert built.engine.runner.steps_launched_ahead >= 3
            assert built.engine.stats().generated_tokens_total == sum(len(t) for t, _ in results[-1])
    assert results[0] == want and results[1] == want
    tokens, reason = results[1][1]
    assert tokens[-1] == stop and reason.name == "STOP"
    assert [len(t) for t, _ in results[1]] == [5, 3, 7]


def _eager_and_overlapped(requests):
    """(tokens eager, tokens through the static decode path with launch-ahead,
    the built engine of the latter, its graphs) on the CPU."""
    eager = build(_config(device="cpu", dtype="float32", overlap_steps=False))
    eager.engine.start()
    try:
        want = _run(eager.engine, requests, "e")
    finally:
        eager.engine.stop()
    built = build(_config(device="cpu", dtype="float32", overlap_steps=True))
    graphs = _with_static_decode(built)
    built.engine.start()
    try:
        got = _run(built.engine, requests, "o")
    finally:
        built.engine.stop()
    return want, got, built, graphs


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter (the GPU test covers the GPU)")
def test_penalized_picks_are_never_launched_ahead_on_cpu() -> None:
    """A repetition penalty needs the previous token on the host: such a batch
    runs one step at a time through the graph path and gives the eager tokens."""
    requests = [(PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True, frequency_penalty=1.5)),
                (PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))]
    want, got, built, graphs = _eager_and_overlapped(requests)
    assert got == want
    assert graphs.replays >= 6 and built.engine.runner.steps_launched_ahead == 0


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter (the GPU test covers the GPU)")
def test_logit_biased_picks_are_launched_ahead_and_give_the_eager_tokens_on_cpu() -> None:
    """A logit bias does not depend on earlier tokens: a biased batch keeps the
    launch-ahead overlap, and the device picks apply the bias as the eager path does."""
    banned = tuple((token, -100.0) for token in range(0, 512, 3))
    requests = [(PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True, logit_bias=banned)),
                (PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))]
    want, got, built, _ = _eager_and_overlapped(requests)
    assert all(token % 3 for token in want[0][0]) and any(token % 3 == 0 for token in want[1][0])
    assert got == want
    assert built.engine.runner.steps_launched_ahead >= 3


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="runs Triton kernels on CPU tensors: needs the interpreter (the GPU test covers the GPU)")
def test_grammar_masked_picks_are_never_launched_ahead_on_cpu() -> None:
    """A grammar's mask depends on the token before: a batch with structured
    output runs one step at a time through the graph path, as eager does."""
    schema = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}},
                                                          "required": ["a"]}))
    requests = [(PROMPTS[0], SamplingParams(max_tokens=12, structured_output=schema)),
                (PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))]
    want, got, built, graphs = _eager_and_overlapped(requests)
    assert got == want and want[0][1].name == "STOP"
    assert graphs.replays >= 6 and built.engine.runner.steps_launched_ahead == 0


@pytest.mark.parametrize("bucket", [1, 2, 3, 5, 8, 12, 13])
def test_every_graph_input_view_starts_aligned(bucket) -> None:
    """Triton specializes pointers on 16-byte alignment: a graph's views must
    start aligned like an eager step's fresh tensors, or a replay and an eager
    step of one batch size compile different kernel variants."""
    inputs = _Inputs.allocate(bucket, 7, torch.device("cpu"))
    for ids, lens, tables in (inputs.host_views[0], inputs.host_views[1],
                              (inputs.ids, inputs.context_lens, inputs.block_tables)):
        assert ids.shape == (4, bucket) and lens.shape == (bucket,) and tables.shape == (bucket, 7)
        assert tables.is_contiguous() and lens.is_contiguous()
        views = [ids[r] for r in range(4)] + [lens, tables]
        assert all(v.data_ptr() % VIEW_ALIGN_BYTES == 0 for v in views)
        ends = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(ends, ends[1:]))  # no two views overlap
