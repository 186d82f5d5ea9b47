"""Token log-probabilities in chat and text completions, through the official
openai client over real HTTP, against the fake dataplane (whose token at
generated position p has log-probability -p/10 and alternatives token + k at
-p/10 - k/2; prompt token j, -j/100)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.fake_dataplane import MODEL_NAME

MODEL = MODEL_NAME


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_logprobs_one_entry_per_text_token(gateway, dataplane, tokenizer):
    client = gateway.openai()
    reply = client.chat.completions.create(
        model=MODEL, messages=ask("Hello world"), temperature=0, logprobs=True, top_logprobs=2
    )
    ids = ids_of(tokenizer, "Hello world")
    content = reply.choices[0].logprobs.content
    assert len(content) == len(ids)  # the final EOS is not text and has no entry
    assert reply.usage.completion_tokens == len(ids) + 1
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    for position, (token_id, entry) in enumerate(zip(ids, content), start=1):
        assert entry.token == tokenizer.decode([token_id])
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert entry.logprob == pytest.approx(-position / 10)
        assert [alt.logprob for alt in entry.top_logprobs] == pytest.approx([-position / 10, -position / 10 - 0.5])
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[1].token == tokenizer.decode([token_id + 1])
    assert dataplane.snapshot()[0][0].sampling.logprobs == 2


def test_chat_logprobs_defaults_and_absence(gateway, dataplane):
    client = gateway.openai()
    plain = client.chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0)
    assert plain.choices[0].logprobs is None
    no_alternatives = client.chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0, logprobs=True)
    assert all(entry.top_logprobs == [] for entry in no_alternatives.choices[0].logprobs.content)
    first, second = dataplane.snapshot()[0]
    assert not first.sampling.HasField("logprobs")
    assert second.sampling.HasField("logprobs") and second.sampling.logprobs == 0


def test_chat_streamed_logprobs_equal_the_whole_answer(gateway, dataplane):
    dataplane.tokens_per_message = 2
    client = gateway.openai()
    kwargs = dict(model=MODEL, messages=ask("one two three four"), temperature=0, logprobs=True, top_logprobs=1)
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]


def test_chat_logprobs_validation(gateway, dataplane):
    client = gateway.openai()
    for kwargs, message in (({"top_logprobs": 2}, "top_logprobs needs logprobs"),
                            ({"logprobs": True, "top_logprobs": 21}, "less than or equal to 20")):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=ask("hi"), **kwargs)
        assert message in info.value.response.json()["error"]["message"]
    assert dataplane.snapshot()[0] == []


def test_completion_logprobs_legacy_shape(gateway, dataplane, tokenizer):
    reply = gateway.openai().completions.create(model=MODEL, prompt="Hello world", temperature=0, logprobs=3)
    choice = reply.choices[0]
    ids = ids_of(tokenizer, "Hello world")
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs == pytest.approx([-p / 10 for p in range(1, len(ids) + 1)])
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(ids))]
    for position, (token, top) in enumerate(zip(logprobs.tokens, logprobs.top_logprobs), start=1):
        assert top[token] == pytest.approx(-position / 10) and len(top) <= 3


def test_streamed_completion_logprobs_keep_each_choices_offsets(gateway, dataplane):
    dataplane.tokens_per_message = 2
    client = gateway.openai()
    kwargs = dict(model=MODEL, prompt=["Hello world", "one two three"], temperature=0, logprobs=0)
    whole = {c.index: c.logprobs for c in client.completions.create(**kwargs).choices}
    tokens: dict[int, list[str]] = {0: [], 1: []}
    offsets: dict[int, list[int]] = {0: [], 1: []}
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens[choice.index] += choice.logprobs.tokens
                offsets[choice.index] += choice.logprobs.text_offset
    for index in (0, 1):
        assert tokens[index] == whole[index].tokens and offsets[index] == whole[index].text_offset
        assert whole[index].top_logprobs == [{}] * len(whole[index].tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_the_prompt(gateway, dataplane, tokenizer, stream):
    dataplane.tokens_per_message = 2
    kwargs = dict(model=MODEL, prompt=["Hello world", "one two three"], temperature=0, echo=True, logprobs=1,
                  max_tokens=2)
    client = gateway.openai()
    if stream:
        texts: dict[int, str] = {0: "", 1: ""}
        merged = {i: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []} for i in (0, 1)}
        for chunk in client.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
                for key, values in merged[choice.index].items():
                    values += getattr(choice.logprobs, key)
        results = [(texts[i], merged[i]) for i in (0, 1)]
    else:
        reply = client.completions.create(**kwargs)
        results = [(c.text, c.logprobs.model_dump()) for c in sorted(reply.choices, key=lambda c: c.index)]
    for (text, logprobs), prompt_text in zip(results, ["Hello world", "one two three"]):
        ids = ids_of(tokenizer, prompt_text)
        assert text == prompt_text + tokenizer.decode(ids[:2])
        assert "".join(logprobs["tokens"]) == text
        assert logprobs["text_offset"] == [len("".join(logprobs["tokens"][:i])) for i in range(len(ids) + 2)]
        # The prompt's first token has nothing before it; then the prompt's, then the generated ones.
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        want = [-j / 100 for j in range(1, len(ids))] + [-0.1, -0.2]
        assert logprobs["token_logprobs"][1:] == pytest.approx(want)
    requests = dataplane.snapshot()[0]
    assert all(r.sampling.prompt_logprobs == 1 and r.sampling.logprobs == 1 for r in requests)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_scores_only_the_prompt(gateway, dataplane, tokenizer, stream):
    client = gateway.openai()
    kwargs = dict(model=MODEL, prompt="Hello world", echo=True, logprobs=0, max_tokens=0)
    ids = ids_of(tokenizer, "Hello world")
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        token_logprobs = [v for c in chunks if c.choices for v in c.choices[0].logprobs.token_logprobs]
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
    else:
        reply = client.completions.create(**kwargs)
        text, reasons, usage = reply.choices[0].text, [reply.choices[0].finish_reason], reply.usage
        token_logprobs = reply.choices[0].logprobs.token_logprobs
    assert text == "Hello world" and reasons == ["length"]
    assert token_logprobs[0] is None
    assert token_logprobs[1:] == pytest.approx([-j / 100 for j in range(1, len(ids))])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (len(ids), 0, len(ids))
    assert dataplane.snapshot()[0][-1].sampling.max_tokens == 1  # the dataplane needs one


def test_max_tokens_zero_needs_echo(gateway, dataplane):
    with pytest.raises(openai.BadRequestError) as info:
        gateway.openai().completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert "max_tokens 0 needs echo" in info.value.response.json()["error"]["message"]
    assert dataplane.snapshot()[0] == []
