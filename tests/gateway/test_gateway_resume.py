"""A dataplane lost mid-request: the gateway waits for it and continues the
sequence (gateway/resume.py), within its outage count and wait."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from gateway.resume import ResumePolicy, continuation
from pagedweight.v1 import inference_pb2
from tests.gateway.fake_dataplane import MODEL_NAME, FakeDataplane
from tests.gateway.harness import scrape

MODEL = MODEL_NAME
TOKENS = 8
ENDLESS = {"temperature": 0, "max_tokens": TOKENS, "extra_body": {"ignore_eos": True}}


def test_a_stream_cut_mid_request_continues_where_it_stopped(gateway, dataplane):
    dataplane.drop_after_tokens = [3]
    chunks = list(gateway.openai().completions.create(
        model=MODEL, prompt="Hello world", stream=True, stream_options={"include_usage": True}, logprobs=1, **ENDLESS
    ))
    assert chunks[-1].usage.completion_tokens == TOKENS
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks if c.choices) == TOKENS
    first, resumed = dataplane.snapshot()[0]
    assert list(resumed.prompt_token_ids[: len(first.prompt_token_ids)]) == list(first.prompt_token_ids)
    assert len(resumed.prompt_token_ids) == len(first.prompt_token_ids) + 3
    assert resumed.sampling.max_tokens == TOKENS - 3 and resumed.request_id == f"{first.request_id}-resumed1"
    assert scrape(gateway.url)[("pagedweight_gateway_sequences_resumed_total", ())] == 1


def test_prompt_logprobs_come_once_and_are_not_asked_again(gateway, dataplane):
    dataplane.drop_after_tokens = [2]
    reply = gateway.openai().completions.create(model=MODEL, prompt="Hello world", echo=True, logprobs=0, **ENDLESS)
    first, resumed = dataplane.snapshot()[0]
    assert first.sampling.HasField("prompt_logprobs") and not resumed.sampling.HasField("prompt_logprobs")
    tokens = reply.choices[0].logprobs.tokens
    assert len(tokens) == len(first.prompt_token_ids) + TOKENS


@pytest.mark.parametrize(("outages", "drops"), [(0, [2]), (1, [2, 2])])
def test_more_losses_than_allowed_fail_the_request(make_gateway, dataplane, outages, drops):
    gateway = make_gateway(dataplane_outages=outages)
    dataplane.drop_after_tokens = drops
    with pytest.raises(openai.InternalServerError) as info:
        gateway.openai().completions.create(model=MODEL, prompt="Hello world", **ENDLESS)
    assert info.value.status_code == 503
    assert len(dataplane.snapshot()[0]) == outages + 1


def test_a_dataplane_that_stops_and_comes_back_within_the_wait_loses_nothing(make_gateway, tokenizer):
    first = FakeDataplane(tokenizer)
    first.delay_s = 0.05
    address = first.start()
    port = int(address.rsplit(":", 1)[1])
    gateway = make_gateway(dataplane=address, dataplane_wait_s=20)
    stream = iter(gateway.openai().completions.create(
        model=MODEL, prompt="Hello world", stream=True, temperature=0, max_tokens=40, extra_body={"ignore_eos": True}
    ))
    next(stream)
    first.stop()  # the connection is lost mid-stream
    second = FakeDataplane(tokenizer, port=port)
    restart = threading.Timer(0.5, second.start)
    restart.start()
    try:
        texts = [chunk.choices[0].text for chunk in stream]
    finally:
        restart.join()
        second.stop()
    assert texts and len(second.snapshot()[0]) == 1
    assert second.snapshot()[0][0].sampling.max_tokens < 40


def test_a_dataplane_that_stays_away_fails_the_request_after_the_wait(make_gateway, tokenizer):
    gone = FakeDataplane(tokenizer)
    gone.delay_s = 0.05
    gateway = make_gateway(dataplane=gone.start(), dataplane_wait_s=0.5)
    stream = iter(gateway.openai().completions.create(
        model=MODEL, prompt="Hello world", stream=True, temperature=0, max_tokens=40, extra_body={"ignore_eos": True}
    ))
    next(stream)
    gone.stop()
    started = time.monotonic()
    with pytest.raises(openai.APIError) as err:
        list(stream)
    assert time.monotonic() - started < 10
    assert "unavailable" in str(err.value).lower()


def test_continuation_keeps_the_request_and_counts_down():
    request = inference_pb2.GenerateRequest(request_id="r", prompt_token_ids=[1, 2, 3])
    request.sampling.max_tokens = 5
    request.sampling.prompt_logprobs = 0
    resumed = continuation(request, [7, 8], 1, prompt_logprobs_received=True)
    assert list(resumed.prompt_token_ids) == [1, 2, 3, 7, 8] and resumed.sampling.max_tokens == 3
    assert resumed.request_id == "r-resumed1" and not resumed.sampling.HasField("prompt_logprobs")
    assert list(request.prompt_token_ids) == [1, 2, 3]  # the original is untouched
    assert continuation(request, [7], 2, prompt_logprobs_received=False).sampling.HasField("prompt_logprobs")
    with pytest.raises(ValueError):
        ResumePolicy(outages=-1, wait_s=1.0)
