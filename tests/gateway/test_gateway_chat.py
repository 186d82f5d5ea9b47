"""Chat completions through the official openai client, over real HTTP, against
the fake dataplane over real gRPC."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.fake_dataplane import MODEL_NAME

MODEL = MODEL_NAME


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_non_streaming_echo_with_usage(gateway, dataplane, tokenizer):
    client = gateway.openai()
    reply = client.chat.completions.create(model=MODEL, messages=ask("Hello world"), temperature=0)
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert [c.index for c in reply.choices] == [0]
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "Hello world"  # the EOS token is not text
    assert reply.choices[0].finish_reason == "stop"
    requests, *_ = dataplane.snapshot()
    prompt = list(requests[0].prompt_token_ids)
    assert tokenizer.decode(prompt, skip_special_tokens=False) == "<s><|user|>Hello world<|end|><|assistant|>"
    reply_tokens = len(tokenizer.encode("Hello world").ids)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == reply_tokens + 1  # + the EOS token
    assert reply.usage.total_tokens == len(prompt) + reply_tokens + 1


def test_max_tokens_gives_length_and_sampling_params_reach_dataplane(gateway, dataplane, tokenizer):
    client = gateway.openai()
    reply = client.chat.completions.create(
        model=MODEL, messages=ask("one two three four"), max_tokens=2, temperature=0.5, top_p=0.9, seed=11,
        extra_body={"top_k": 7},
    )
    expected = tokenizer.decode(tokenizer.encode("one two three four").ids[:2])
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 2
    sampling = dataplane.snapshot()[0][0].sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.seed) == (2, 7, 11)
    assert sampling.presence_penalty == sampling.frequency_penalty == 0.0
    assert sampling.temperature == pytest.approx(0.5) and sampling.top_p == pytest.approx(0.9)
    greedy = client.chat.completions.create(
        model=MODEL, messages=ask("one two three four"), max_completion_tokens=2, temperature=0
    )
    assert greedy.choices[0].message.content == expected
    assert dataplane.snapshot()[0][1].sampling.max_tokens == 2


def test_streaming_with_include_usage(gateway, dataplane):
    dataplane.tokens_per_message = 2
    client = gateway.openai()
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("Hello world"), temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == chunks[-1].usage.total_tokens - chunks[-1].usage.prompt_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_streaming_multibyte_text_never_broken(gateway, dataplane):
    text = "日本語 🙂 é"
    client = gateway.openai()
    stream = client.chat.completions.create(model=MODEL, messages=ask(text), temperature=0, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) > 1  # really incremental


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text_and_cancels_dataplane(gateway, dataplane, stream):
    dataplane.delay_s = 0.01
    client = gateway.openai()
    kwargs = dict(model=MODEL, messages=ask("one two three four"), temperature=0, max_tokens=200, stop=["ee f", "wo th"],
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert reason == ["stop"]
    else:
        reply = client.chat.completions.create(**kwargs)
        content, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert reason == "stop"
        assert reply.usage.completion_tokens < 200
    assert content == "one t"  # cut before the earliest stop string
    assert dataplane.wait_until(lambda d: len(d.snapshot()[2]) == 1 and not d.snapshot()[1])


def test_n_choices_are_indexed_and_seeded(gateway, dataplane):
    client = gateway.openai()
    greedy = client.chat.completions.create(model=MODEL, messages=ask("Hello world"), temperature=0, n=3)
    assert sorted(c.index for c in greedy.choices) == [0, 1, 2]
    assert {c.message.content for c in greedy.choices} == {"Hello world"}
    assert greedy.usage.completion_tokens == 3 * (greedy.usage.completion_tokens // 3)
    sampled = client.chat.completions.create(
        model=MODEL, messages=ask("The quick brown fox jumps over the lazy dog"), temperature=1.0, n=2, seed=5
    )
    seeds = sorted(r.sampling.seed for r in dataplane.snapshot()[0][-2:])
    assert seeds == [5, 6]
    alone = client.chat.completions.create(
        model=MODEL, messages=ask("The quick brown fox jumps over the lazy dog"), temperature=1.0, seed=6
    )
    by_index = {c.index: c.message.content for c in sampled.choices}
    assert alone.choices[0].message.content == by_index[1]


def test_streaming_n_choices(gateway):
    client = gateway.openai()
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ask("Hello world"), temperature=0, n=2, stream=True
    ))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: "Hello world", 1: "Hello world"}


def test_seed_determinism(gateway):
    client = gateway.openai()
    prompt = ask("The quick brown fox jumps over the lazy dog")
    first, second = (
        client.chat.completions.create(model=MODEL, messages=prompt, temperature=1.0, seed=1234).choices[0].message.content
        for _ in range(2)
    )
    other = client.chat.completions.create(model=MODEL, messages=prompt, temperature=1.0, seed=99).choices[0].message.content
    assert first == second
    assert other != first


def expect_400(call) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    assert info.value.status_code == 400
    body = info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


def test_invalid_requests_are_openai_shaped_400(gateway, dataplane):
    client = gateway.openai()
    error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ask("hi"), temperature=-1))
    assert error["param"] == "temperature" and "greater than or equal to 0" in error["message"]
    error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=[], temperature=0))
    assert error["param"] == "messages"
    error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ask("hi"), stop=[""]))
    assert "non-empty" in error["message"]
    error = expect_400(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "tool-x", "content": "hi"}]
    ))
    assert "unknown role: tool-x" in error["message"]  # the template's raise_exception text
    unsupported = [
        ({"logit_bias": {"5": -101}}, "logit_bias of token 5 must be in [-100, 100]"),
        ({"presence_penalty": 2.5}, "less than or equal to 2"),
        ({"response_format": {"type": "xml"}}, "'text', 'json_object' or 'json_schema'"),
        ({"response_format": {"type": "json_schema"}}, "needs a 'json_schema' object"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice 'auto' is not supported"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
         "tool_choice 'auto' is not supported"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "'g', which is not among the tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}], "tool_choice": "required"},
         "should match pattern"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "cannot be combined with a forced tool call"),
        ({"extra_body": {"functions": [{"name": "f"}]}}, "functions (the legacy form of tools) are not supported"),
        ({"modalities": ["text", "audio"]}, "only text output is supported"),
    ]
    for kwargs, message in unsupported:
        error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ask("hi"), **kwargs))
        assert message in error["message"], kwargs
    plain_text = client.chat.completions.create(
        model=MODEL, messages=ask("hi"), temperature=0, response_format={"type": "text"}, modalities=["text"]
    )
    assert plain_text.choices[0].message.content == "hi"
    assert len(dataplane.snapshot()[0]) == 1  # only the last one reached the dataplane


def test_context_length_errors(gateway, dataplane):
    client = gateway.openai()
    long_text = "one two three four five six seven eight nine ten " * 40
    error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ask(long_text)))
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in error["message"]
    error = expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=255))
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "in the completion" in error["message"]
    assert dataplane.snapshot()[0] == []


def test_unknown_model_is_404(gateway):
    with pytest.raises(openai.NotFoundError) as info:
        gateway.openai().chat.completions.create(model="no-such-model", messages=ask("hi"))
    assert info.value.response.json()["error"]["code"] == "model_not_found"


def test_models_list(gateway):
    models = gateway.openai().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == 256


def test_model_name_override(make_gateway):
    gateway = make_gateway(model_name="served-as")
    reply = gateway.openai().chat.completions.create(model="served-as", messages=ask("Hello"), temperature=0)
    assert reply.model == "served-as" and reply.choices[0].message.content == "Hello"
