"""Structured output: the grammar's mask and state (xgrammar over the model's
tokenizer), and the engine keeping every generated text inside the grammar."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

from dataplane.engine_io import InvalidRequest, QueueSink
from dataplane.sampling_params import SamplingParams, StructuredOutput
from dataplane.structured_output import GrammarBackend

TIMEOUT_S = 120.0
CHOICE_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
VALID = {json.dumps({"answer": a, "sure": s}) for a in ("yes", "no", "maybe") for s in (True, False)}


def schema_output(schema: dict = CHOICE_SCHEMA) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema))


@pytest.fixture(scope="module")
def tokenizer(random_ckpt) -> Tokenizer:
    return Tokenizer.from_file(str(random_ckpt / "tokenizer.json"))


@pytest.fixture(scope="module")
def backend(random_ckpt, tokenizer) -> GrammarBackend:
    eos = json.loads((random_ckpt / "config.json").read_text())["eos_token_id"]
    return GrammarBackend((random_ckpt / "tokenizer.json").read_text(), tokenizer.get_vocab_size(), (eos,))


def test_the_mask_allows_exactly_the_grammars_next_tokens(backend, tokenizer):
    grammar = backend.start(schema_output())
    logits = torch.zeros(tokenizer.get_vocab_size())
    masked = grammar.mask(logits)
    assert torch.equal(logits, torch.zeros_like(logits))  # the input is left alone
    allowed = [t for t in range(len(masked)) if masked[t] == 0]
    assert allowed and all(tokenizer.decode([t]).startswith("{") or tokenizer.decode([t]) == "" for t in allowed)
    assert torch.isinf(masked).sum() == len(masked) - len(allowed)
    for token in tokenizer.encode('{"answer": "no", "sure": true}', add_special_tokens=False).ids:
        assert grammar.accept(token)
    assert not grammar.terminated  # the stop token still has to come
    assert not grammar.accept(tokenizer.token_to_id("a") or 97)  # nothing may follow but the stop token


def _apply_as_on_the_gpu(logits, bitmask, *, vocab_size=None, indices=None, backend="auto"):
    """xgrammar's CUDA backend (its Triton kernel) in torch: one row per logits row (1 for a 1-D
    tensor), each row's words found at bitmask.stride(0) apart and only that many read; words
    not read leave their tokens masked (what the H200 run of session 38 showed for a 1-D row)."""
    rows = logits.shape[0] if logits.ndim == 2 else 1
    flat_logits, flat_mask = logits.reshape(rows, -1), bitmask.reshape(-1)
    words_per_row = (vocab_size + 31) // 32
    width = bitmask.stride(0)
    for r in range(rows):
        words = torch.zeros(words_per_row, dtype=torch.int32)
        read = min(width, words_per_row)
        words[:read] = flat_mask[r * width: r * width + read]
        allowed = ((words[:, None] >> torch.arange(32)) & 1).reshape(-1)[:vocab_size].bool()  # [V]
        flat_logits[r, :vocab_size].masked_fill_(~allowed, float("-inf"))


def test_the_mask_keeps_to_xgrammars_batch_shapes(backend, tokenizer, monkeypatch):
    """The GPU path of xgrammar reads a row's width from the bitmask's first stride: a 1-D
    bitmask (stride 1) masks every token past the first 32 there, while the CPU path copes."""
    want = backend.start(schema_output()).mask(torch.zeros(tokenizer.get_vocab_size()))
    import xgrammar

    monkeypatch.setattr(xgrammar, "apply_token_bitmask_inplace", _apply_as_on_the_gpu)
    got = backend.start(schema_output()).mask(torch.zeros(tokenizer.get_vocab_size()))
    assert torch.equal(got, want) and torch.isfinite(got).sum() > 0


def test_bad_schemas_are_refused(backend):
    with pytest.raises(ValueError, match="cannot be compiled"):
        backend.start(schema_output({"type": "object", "properties": {"x": {"type": "no-such-type"}}}))
    with pytest.raises(ValueError, match="not JSON"):
        SamplingParams(structured_output=StructuredOutput("json_schema", "{not json")).validate(100)
    assert backend.start(None) is None


def generate(engine, rid: str, params: SamplingParams, prompt=None):
    sink = QueueSink()
    engine.add_request(rid, prompt or list(range(30, 45)), params, sink)
    outs = list(sink.outputs(timeout=TIMEOUT_S))
    return [t for out in outs for t in out.new_token_ids], outs[-1].finish_reason


def test_every_generated_text_follows_the_schema(make_engine, tokenizer):
    engine = make_engine()
    eos = set(engine.model_info.eos_token_ids)
    texts = set()
    cases = [SamplingParams(max_tokens=64, structured_output=schema_output())]
    cases += [SamplingParams(max_tokens=64, temperature=1.5, seed=seed, structured_output=schema_output())
              for seed in range(6)]
    # A bias toward a token the grammar forbids does not get it through.
    cases.append(SamplingParams(max_tokens=64, logit_bias=((tokenizer.token_to_id("a") or 97, 100.0),),
                                structured_output=schema_output()))
    for i, params in enumerate(cases):
        tokens, reason = generate(engine, f"r{i}", params)
        assert reason.name == "STOP" and tokens[-1] in eos
        text = tokenizer.decode(tokens[:-1])
        assert text in VALID, text
        texts.add(text)
    assert len(texts) > 1  # sampling still chooses within the grammar


def test_a_too_short_limit_ends_by_length_inside_the_grammar(make_engine, tokenizer):
    engine = make_engine()
    tokens, reason = generate(engine, "short", SamplingParams(max_tokens=3, structured_output=schema_output()))
    assert reason.name == "LENGTH" and len(tokens) == 3
    assert any(valid.startswith(tokenizer.decode(tokens)) for valid in VALID)


def test_a_json_object_is_any_object_and_bad_requests_are_refused(make_engine, tokenizer):
    engine = make_engine()
    tokens, reason = generate(engine, "obj", SamplingParams(max_tokens=200, structured_output=StructuredOutput(
        "json_object")))
    if reason.name == "STOP":
        assert isinstance(json.loads(tokenizer.decode(tokens[:-1])), dict)
    else:  # the random model may keep writing inside a string until the limit
        assert tokenizer.decode(tokens).startswith("{")
    with pytest.raises(InvalidRequest, match="cannot be compiled"):
        engine.add_request("bad", [1, 2, 3], SamplingParams(structured_output=schema_output({"type": "nope"})),
                           QueueSink())
