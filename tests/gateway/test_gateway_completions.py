"""Text completions (/v1/completions) through the official openai client, over
real HTTP, against the fake dataplane over real gRPC. The fake continues a
plain prompt with the prompt's own tokens (it has no chat turns)."""

from __future__ import annotations

import openai
import pytest

from gateway.generation import DEFAULT_COMPLETION_TOKENS
from gateway.protocol import MAX_CHOICES
from tests.gateway.fake_dataplane import EOS, MODEL_NAME, VOCAB_SIZE, FakeDataplane, build_metaspace_tokenizer
from tests.gateway.harness import scrape

MODEL = MODEL_NAME


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_text_prompt_is_continued_without_a_template(gateway, dataplane, tokenizer):
    reply = gateway.openai().completions.create(model=MODEL, prompt="Hello world", temperature=0)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-") and reply.model == MODEL
    assert [(c.index, c.text, c.finish_reason) for c in reply.choices] == [(0, "Hello world", "stop")]
    request = dataplane.snapshot()[0][0]
    prompt = ids_of(tokenizer, "Hello world")
    assert list(request.prompt_token_ids) == prompt  # no chat markers around it
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(prompt) + 1  # + the EOS token
    assert reply.usage.total_tokens == 2 * len(prompt) + 1


def test_max_tokens_default_and_the_context_left(gateway, dataplane, tokenizer):
    client = gateway.openai()
    text = "one two three four five six seven eight nine ten"
    reply = client.completions.create(model=MODEL, prompt=text, temperature=0, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == DEFAULT_COMPLETION_TOKENS
    context = 256
    long_ids = (ids_of(tokenizer, text) * 40)[: context - 3]
    near_end = client.completions.create(model=MODEL, prompt=long_ids, temperature=0, extra_body={"ignore_eos": True})
    assert near_end.usage.completion_tokens == 3  # the default never overruns the context
    sent = [r.sampling.max_tokens for r in dataplane.snapshot()[0]]
    assert sent == [DEFAULT_COMPLETION_TOKENS, 3]
    explicit = client.completions.create(model=MODEL, prompt=text, max_tokens=40, extra_body={"ignore_eos": True})
    assert explicit.usage.completion_tokens == 40


def test_repetition_penalties_reach_the_dataplane(gateway, dataplane):
    gateway.openai().completions.create(
        model=MODEL, prompt="Hello", temperature=0, presence_penalty=0.5, frequency_penalty=-1.25
    )
    sampling = dataplane.snapshot()[0][0].sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.25)


def test_logit_bias_reaches_the_dataplane_for_every_choice(gateway, dataplane):
    gateway.openai().completions.create(
        model=MODEL, prompt="Hello", temperature=0, n=2, logit_bias={"17": -100, "5": 2.5}
    )
    for request in dataplane.snapshot()[0]:
        assert dict(request.sampling.logit_bias) == {5: 2.5, 17: -100.0}


def test_cached_prompt_tokens_count_each_prompt_once(gateway, dataplane, tokenizer):
    dataplane.cached_fraction = 0.5
    client = gateway.openai()
    prompts = ["Hello world", "one two three four"]
    reply = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=3)
    sent = {tuple(r.prompt_token_ids) for r in dataplane.snapshot()[0]}
    assert len(sent) == 2
    want = sum(len(ids) // 2 for ids in sent)  # not doubled by n
    assert reply.usage.prompt_tokens_details.cached_tokens == want
    stream = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=3, stream=True,
                                       stream_options={"include_usage": True})
    assert [c.usage for c in stream if c.usage][0].prompt_tokens_details.cached_tokens == want
    dataplane.cached_fraction = 0.0
    plain = client.completions.create(model=MODEL, prompt=prompts, temperature=0, max_tokens=3)
    assert plain.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize(("response_format", "field", "value"), [
    ({"type": "json_object"}, "json_object", True),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": ["x"]}}},
     "json_schema", '{"type": "object", "required": ["x"]}'),
    ({"type": "json_schema", "json_schema": {"name": "any"}}, "json_object", True),
])
def test_response_format_reaches_the_dataplane_as_a_grammar(gateway, dataplane, response_format, field, value):
    gateway.openai().completions.create(model=MODEL, prompt="Hello", extra_body={"response_format": response_format})
    gateway.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], response_format=response_format
    )
    for request in dataplane.snapshot()[0]:
        structured = request.sampling.structured_output
        assert request.sampling.HasField("structured_output") and structured.WhichOneof("kind") == field
        assert getattr(structured, field) == value


def test_text_response_format_sends_no_grammar(gateway, dataplane):
    gateway.openai().completions.create(model=MODEL, prompt="Hello", extra_body={"response_format": {"type": "text"}})
    assert not dataplane.snapshot()[0][0].sampling.HasField("structured_output")


def test_several_prompts_and_choices_are_indexed_prompt_major(gateway, dataplane, tokenizer):
    client = gateway.openai()
    reply = client.completions.create(model=MODEL, prompt=["Hello world", "one two"], n=2, temperature=0)
    texts = {c.index: c.text for c in reply.choices}
    assert texts == {0: "Hello world", 1: "Hello world", 2: "one two", 3: "one two"}
    assert reply.usage.prompt_tokens == len(ids_of(tokenizer, "Hello world")) + len(ids_of(tokenizer, "one two"))
    sampled = client.completions.create(model=MODEL, prompt=["Hello world", "one two"], n=2, temperature=1.0, seed=5)
    by_id = {r.request_id.rsplit("-", 1)[1]: r.sampling.seed for r in dataplane.snapshot()[0][-4:]}
    assert by_id == {"0": 5, "1": 6, "2": 5, "3": 6}  # choice j of every prompt uses seed + j
    assert len({c.index for c in sampled.choices}) == 4


def test_token_id_prompts_and_echo(gateway, dataplane, tokenizer):
    client = gateway.openai()
    hello, one = ids_of(tokenizer, "Hello world"), ids_of(tokenizer, "one two")
    single = client.completions.create(model=MODEL, prompt=hello, temperature=0, echo=True)
    assert single.choices[0].text == "Hello worldHello world"  # the prompt, then its continuation
    batch = client.completions.create(model=MODEL, prompt=[hello, one], temperature=0)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == ["Hello world", "one two"]
    assert [list(r.prompt_token_ids) for r in dataplane.snapshot()[0][1:]] == [hello, one]
    echoed = client.completions.create(model=MODEL, prompt="one two", temperature=0, echo=True, max_tokens=1)
    assert echoed.choices[0].text == "one two" + tokenizer.decode(one[:1])
    assert echoed.usage.completion_tokens == 1  # the echoed prompt is not completion


def test_streaming_with_echo_and_usage(gateway, dataplane):
    dataplane.tokens_per_message = 2
    client = gateway.openai()
    chunks = list(client.completions.create(
        model=MODEL, prompt=["Hello world", "one two"], temperature=0, echo=True, stream=True,
        stream_options={"include_usage": True},
    ))
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    texts: dict[int, str] = {0: "", 1: ""}
    finals: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            finals[choice.index] = choice.finish_reason
    assert texts == {0: "Hello worldHello world", 1: "one twoone two"}
    assert [c.choices[0].text for c in chunks[:2]] == ["Hello world", "one two"]  # the echo comes first
    assert finals == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_stop_string_cancels_at_dataplane(gateway, dataplane):
    dataplane.delay_s = 0.01
    chunks = list(gateway.openai().completions.create(
        model=MODEL, prompt="one two three four", temperature=0, max_tokens=200, stop="wo th", stream=True,
        extra_body={"ignore_eos": True},
    ))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "one t"
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    assert dataplane.wait_until(lambda d: len(d.snapshot()[2]) == 1 and not d.snapshot()[1])


def expect_400(call) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    body = info.value.response.json()
    assert info.value.status_code == 400 and body["error"]["type"] == "invalid_request_error"
    return body["error"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": []}, "must not be empty"),
        ({"prompt": [[1, 2], []]}, "must not be empty"),
        ({"prompt": [VOCAB_SIZE + 7]}, f"outside the tokenizer's vocabulary (size {VOCAB_SIZE})"),
        ({"prompt": "hi", "suffix": "end"}, "suffix is not supported"),
        ({"prompt": "hi", "logprobs": 21}, "less than or equal to 20"),
        ({"prompt": "hi", "best_of": 3}, "best_of other than n"),
        ({"prompt": "hi", "logit_bias": {"5": 100.5}}, "logit_bias of token 5 must be in [-100, 100]"),
        ({"prompt": "hi", "logit_bias": {"five": 1.0}}, "logit_bias keys must be token ids"),
        ({"prompt": "hi", "logit_bias": {"-5": 1.0}}, "logit_bias keys must be token ids"),
        ({"prompt": "hi", "logit_bias": {str(t): 1.0 for t in range(301)}}, "at most 300 tokens"),
        ({"prompt": "hi", "logit_bias": {str(VOCAB_SIZE): 1.0}}, "outside the tokenizer's vocabulary"),
        ({"prompt": ["hi"] * 5, "n": 4}, f"at most {MAX_CHOICES} choices"),
        ({"prompt": "hi", "max_tokens": -1}, "greater than or equal to 0"),
        ({"prompt": "hi", "temperature": 3}, "less than or equal to 2"),
    ],
)
def test_invalid_requests_are_400_and_reach_nothing(gateway, dataplane, kwargs, message):
    error = expect_400(lambda: gateway.openai().completions.create(model=MODEL, **kwargs))
    assert message in error["message"]
    assert dataplane.snapshot()[0] == []


def test_context_length_errors_point_at_the_field(gateway, dataplane, tokenizer):
    client = gateway.openai()
    long_text = "one two three four five six seven eight nine ten " * 40
    error = expect_400(lambda: client.completions.create(model=MODEL, prompt=long_text))
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    error = expect_400(lambda: client.completions.create(model=MODEL, prompt=["hi", "hello"], max_tokens=255))
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert dataplane.snapshot()[0] == []


def test_unknown_model_is_404_and_special_tokens_are_not_text(gateway, dataplane, tokenizer):
    with pytest.raises(openai.NotFoundError):
        gateway.openai().completions.create(model="no-such-model", prompt="hi")
    eos = tokenizer.token_to_id(EOS)
    reply = gateway.openai().completions.create(
        model=MODEL, prompt=[*ids_of(tokenizer, "Hello"), eos], temperature=0, echo=True
    )
    assert reply.choices[0].text.startswith("Hello") and EOS not in reply.choices[0].text


def test_a_continuation_decodes_with_the_prompt_before_it(make_gateway):
    # With SentencePiece-style tokens the first generated word needs the
    # prompt before it to get its leading space; a chat reply starts fresh.
    fake = FakeDataplane(build_metaspace_tokenizer())
    fake.start()
    try:
        gateway = make_gateway(dataplane=fake.address)
        reply = gateway.openai().completions.create(model=MODEL, prompt="Hello world", temperature=0)
        assert reply.choices[0].text == " Hello world"
        streamed = gateway.openai().completions.create(model=MODEL, prompt="Hello world", temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == " Hello world"
        chat = gateway.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello world"}], temperature=0
        )
        assert chat.choices[0].message.content == "Hello world"
    finally:
        fake.stop()


def test_metrics_count_text_completions(gateway, dataplane, tokenizer):
    client = gateway.openai()
    client.completions.create(model=MODEL, prompt=["Hello world", "one two"], temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[])
    m = scrape(gateway.url)
    endpoint = "/v1/completions"
    assert m[("pagedweight_gateway_http_requests_total", (("endpoint", endpoint), ("status", "200")))] == 1
    assert m[("pagedweight_gateway_http_requests_total", (("endpoint", endpoint), ("status", "400")))] == 1
    prompts = len(ids_of(tokenizer, "Hello world")) + len(ids_of(tokenizer, "one two"))
    assert m[("pagedweight_gateway_prompt_tokens_total", ())] == prompts
    assert m[("pagedweight_gateway_sequences_finished_total", (("finish_reason", "stop"),))] == 2
    assert m[("pagedweight_gateway_request_latency_seconds_count", ())] == 1
