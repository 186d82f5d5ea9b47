"""The prefix cache in the engine: a prompt that starts like an earlier one
reuses its K/V and gives what computing it all gives."""

from __future__ import annotations

import pytest

from dataplane.engine_io import QueueSink, RequestOutput
from dataplane.sampling_params import SamplingParams

TIMEOUT_S = 120.0
BLOCK = 16
FIRST = [(7 * i + 3) % 250 + 5 for i in range(40)]  # 40 tokens: two full blocks


def generate(engine, rid: str, prompt: list[int], max_tokens: int) -> list[RequestOutput]:
    sink = QueueSink()
    engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=2), sink)
    return list(sink.outputs(timeout=TIMEOUT_S))


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for out in outs for t in out.new_token_ids]


def logprobs(outs: list[RequestOutput]) -> list[float]:
    return [e.logprob for out in outs for e in out.new_logprobs]


@pytest.mark.parametrize("kv_block_size", [BLOCK])
def test_reused_prefix_and_turns_match_an_engine_without_the_cache(make_engine, kv_block_size, logprob_atol):
    cached = make_engine(kv_block_size=kv_block_size)
    plain = make_engine(kv_block_size=kv_block_size, prefix_caching=False)
    results = {}
    for name, engine in (("cached", cached), ("plain", plain)):
        first = generate(engine, "first", FIRST, max_tokens=12)
        # A second request sharing 35 tokens with the first: 2 blocks reusable.
        second = generate(engine, "second", FIRST[:35] + [9, 8, 7], max_tokens=6)
        # The next turn: the first prompt, its answer and more. 51 computed
        # tokens of the first request: 3 full blocks, one of them generated.
        turn = generate(engine, "turn", FIRST + tokens(first) + [11, 12], max_tokens=6)
        results[name] = (first, second, turn)
        stats = engine.stats()
        hits = [out.cached_prompt_tokens for outs in (first, second, turn) for out in outs[:1]]
        if name == "cached":
            assert hits == [0, 2 * BLOCK, 3 * BLOCK]
            assert stats.prefix_cached_tokens_total == 5 * BLOCK
            assert stats.arena.cached_pages > 0 and stats.kv_blocks_used == 0
        else:
            assert hits == [0, 0, 0] and stats.prefix_cached_tokens_total == 0 and stats.arena.cached_pages == 0
    for got, want in zip(results["cached"], results["plain"]):
        assert tokens(got) == tokens(want)
        assert logprobs(got) == pytest.approx(logprobs(want), abs=logprob_atol)
    # Computed prompt tokens: the cached engine skipped exactly what it reused.
    assert plain.stats().prompt_tokens_total - cached.stats().prompt_tokens_total == 5 * BLOCK
