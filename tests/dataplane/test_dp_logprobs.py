"""Log-probabilities of generated tokens: the step function against
torch.log_softmax, and the engine's reported values against transformers'
MixtralForCausalLM on the same checkpoint and tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralForCausalLM

from dataplane.engine_io import InvalidRequest, QueueSink, RequestOutput
from dataplane.logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, step_logprobs
from dataplane.sampling_params import SamplingParams
from dataplane.sequence import Sequence

TIMEOUT_S = 60
ATOL = 1e-4  # the step function on the same bf16 logits as the reference


def test_step_logprobs_picks_rows_and_matches_log_softmax():
    torch.manual_seed(3)
    logits = torch.randn(5, 37) * 4  # [S, V]
    picked = torch.tensor([3, 0, 36, 7, 11])  # [S]
    result = step_logprobs(logits.to(torch.bfloat16), picked, [2, None, 0, None, 5])
    assert result is not None and result.rows == [0, 2, 4] and result.top_n == [2, 0, 5]
    reference = torch.log_softmax(logits.to(torch.bfloat16).float(), dim=-1)
    for row, entry in zip(result.rows, result.entries()):
        assert entry.logprob == pytest.approx(reference[row, picked[row]].item(), abs=ATOL)
        top = torch.topk(reference[row], len(entry.top_token_ids))
        assert list(entry.top_token_ids) == top.indices.tolist()
        assert list(entry.top_logprobs) == pytest.approx(top.values.tolist(), abs=ATOL)
    assert step_logprobs(logits, picked, [None] * 5) is None


def run(engine, prompts: dict[str, list[int]], params: dict[str, SamplingParams]) -> dict[str, list[RequestOutput]]:
    sinks = {rid: QueueSink() for rid in prompts}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params[rid], sinks[rid])
    return {rid: list(sink.outputs(timeout=TIMEOUT_S)) for rid, sink in sinks.items()}


def test_engine_logprobs_are_the_models_distribution(make_engine, random_ckpt, logprob_atol):
    engine = make_engine()
    prompts = {"greedy": list(range(30, 47)), "sampled": list(range(60, 69)), "plain": list(range(80, 91))}
    params = {
        "greedy": SamplingParams(max_tokens=6, ignore_eos=True, logprobs=4),
        # Temperature, top-k and top-p shape the draw, not the reported values.
        "sampled": SamplingParams(temperature=1.7, top_k=9, top_p=0.8, seed=7, max_tokens=5, ignore_eos=True,
                                  logprobs=0),
        "plain": SamplingParams(max_tokens=4, ignore_eos=True),
    }
    outs = run(engine, prompts, params)
    assert all(not out.new_logprobs for out in outs["plain"])
    peer = MixtralForCausalLM.from_pretrained(random_ckpt, dtype=torch.float32).eval()
    for rid in ("greedy", "sampled"):
        tokens = [t for out in outs[rid] for t in out.new_token_ids]
        entries = [e for out in outs[rid] for e in out.new_logprobs]
        assert len(entries) == len(tokens) == params[rid].max_tokens
        prompt = prompts[rid]
        with torch.no_grad():
            logits = peer(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]  # [generated, V]
        reference = torch.log_softmax(logits.float(), dim=-1)
        for position, (token, entry) in enumerate(zip(tokens, entries)):
            assert entry.logprob == pytest.approx(reference[position, token].item(), abs=logprob_atol)
            assert len(entry.top_token_ids) == params[rid].logprobs
            top = torch.topk(reference[position], len(entry.top_token_ids)).values.tolist()
            assert list(entry.top_logprobs) == pytest.approx(top, abs=logprob_atol)
            for alternative, value in zip(entry.top_token_ids, entry.top_logprobs):
                assert value == pytest.approx(reference[position, alternative].item(), abs=logprob_atol)
            if rid == "greedy":  # the greedy token is the most likely one
                assert entry.logprob == pytest.approx(entry.top_logprobs[0], abs=logprob_atol)


def test_out_of_range_logprobs_are_rejected(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="logprobs must be in"):
        engine.add_request("x", [5, 6], SamplingParams(logprobs=MAX_TOP_LOGPROBS + 1), QueueSink())


def test_prompt_logprobs_through_chunked_prefill_and_preemption(make_engine, random_ckpt, logprob_atol):
    """Every prompt token after the first gets the peer's log-probability,
    whether the prompt is prefilled at once, in chunks, or recomputed after a
    preemption; they come once, with the first token."""
    prompt = [(11 * i) % 300 + 5 for i in range(70)]
    peer = MixtralForCausalLM.from_pretrained(random_ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(peer(torch.tensor([prompt])).logits[0].float(), dim=-1)  # [P, V]
    params = SamplingParams(max_tokens=20, ignore_eos=True, prompt_logprobs=2)
    others = {f"o{i}": [(7 * i + j) % 300 + 9 for j in range(40)] for i in range(3)}
    plain = SamplingParams(max_tokens=30, ignore_eos=True)
    for overrides in ({}, {"max_batched_tokens": 32, "max_running_seqs": 4}, {"max_arena_pages": 9}):
        engine = make_engine(**overrides)
        # "p" arrives last: under memory pressure it is the first preempted.
        outs = run(engine, {**others, "p": prompt}, {"p": params, **{rid: plain for rid in others}})
        if "max_arena_pages" in overrides:
            assert engine.stats().preemptions_total > 0
        first, *rest = outs["p"]
        assert first.new_token_ids and all(not out.prompt_logprobs for out in rest)
        assert all(not out.prompt_logprobs for rid in others for out in outs[rid])
        entries = first.prompt_logprobs
        assert len(entries) == len(prompt) - 1, overrides
        for position, entry in enumerate(entries):
            want = reference[position]
            assert entry.logprob == pytest.approx(want[prompt[position + 1]].item(), abs=logprob_atol)
            assert list(entry.top_logprobs) == pytest.approx(torch.topk(want, 2).values.tolist(), abs=logprob_atol)


def test_recorded_prompt_logprobs_are_not_added_twice():
    seq = Sequence("s", [1, 2, 3, 4, 5], SamplingParams(prompt_logprobs=0), arrival=0)
    entry = [TokenLogprobs(-float(i), (), ()) for i in range(4)]  # prompt tokens 1..4
    seq.add_prompt_logprobs(0, entry[:2])
    assert seq.take_prompt_logprobs() == []  # not complete yet
    seq.add_prompt_logprobs(0, entry[:3])  # a recompute from position 0 after preemption
    seq.add_prompt_logprobs(3, entry[3:])
    assert seq.take_prompt_logprobs() == entry
    assert seq.take_prompt_logprobs() == []  # handed out once
    with pytest.raises(ValueError, match="only 4 recorded"):
        seq.add_prompt_logprobs(6, entry[:1])


def test_frequency_penalty_stops_greedy_repetition(make_engine):
    engine = make_engine()
    prompt = list(range(30, 40))
    base = {"max_tokens": 24, "ignore_eos": True}
    outs = run(engine, {"plain": prompt, "penalized": prompt},
               {"plain": SamplingParams(**base), "penalized": SamplingParams(**base, frequency_penalty=2.0,
                                                                              presence_penalty=2.0)})
    plain, penalized = ([t for out in outs[rid] for t in out.new_token_ids] for rid in ("plain", "penalized"))
    # This random model repeats itself under greedy decoding; a strong penalty stops that.
    assert len(set(plain)) < len(plain)
    assert len(set(penalized)) == len(penalized)


def test_logit_bias_forces_and_bans_tokens_and_logprobs_stay_the_models(make_engine):
    engine = make_engine()
    prompt = list(range(30, 40))
    base = {"max_tokens": 6, "ignore_eos": True, "logprobs": 1}
    outs = run(engine, {"plain": prompt}, {"plain": SamplingParams(**base)})
    plain = [t for out in outs["plain"] for t in out.new_token_ids]
    plain_logprobs = [e for out in outs["plain"] for e in out.new_logprobs]
    forced_token = next(t for t in range(5, 100) if t not in plain)
    outs = run(engine, {"forced": prompt, "banned": prompt}, {
        "forced": SamplingParams(**base, logit_bias=((forced_token, 100.0),)),
        "banned": SamplingParams(**base, logit_bias=tuple((t, -100.0) for t in sorted(set(plain)))),
    })
    forced = [t for out in outs["forced"] for t in out.new_token_ids]
    banned = [t for out in outs["banned"] for t in out.new_token_ids]
    assert forced == [forced_token] * len(plain)
    assert not set(banned) & set(plain) and len(banned) == len(plain)
    # Logprobs are the model's own: the forced token was not the model's
    # choice at the first position, so it is no likelier than the greedy one.
    first = outs["forced"][0].new_logprobs[0]
    assert first.logprob < plain_logprobs[0].logprob - 1e-3
