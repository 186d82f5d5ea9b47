"""Operational behaviour over real HTTP: auth, admission (429), dataplane down
(503), metrics, health, client-disconnect cancellation, dataplane errors."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import httpx
import openai
import pytest

from tests.gateway.fake_dataplane import MODEL_NAME, FakeDataplane
from tests.gateway.harness import scrape

MODEL = MODEL_NAME
SLOW_DELAY_S = 0.05
LONG_GENERATION = dict(temperature=0, max_tokens=200, extra_body={"ignore_eos": True})


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_body(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def queue_one_request(gateway) -> tuple[threading.Thread, list[str]]:
    """A greedy "Hello" chat sent from a thread, once it waits for admission;
    its reply's text lands in the list."""
    result: list[str] = []
    client = gateway.openai()
    thread = threading.Thread(target=lambda: result.append(
        client.chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0).choices[0].message.content
    ))
    thread.start()
    deadline = time.monotonic() + 5
    while scrape(gateway.url).get(("pagedweight_gateway_requests_waiting", ())) != 1:
        assert time.monotonic() < deadline, "the request never queued"
        time.sleep(0.02)
    return thread, result


def test_api_keys(make_gateway):
    gateway = make_gateway(api_keys=("key-one", "key-two"))
    reply = gateway.openai(api_key="key-two").chat.completions.create(
        model=MODEL, messages=ask("Hello"), temperature=0
    )
    assert reply.choices[0].message.content == "Hello"
    with pytest.raises(openai.AuthenticationError) as info:
        gateway.openai(api_key="wrong").chat.completions.create(model=MODEL, messages=ask("Hello"))
    assert info.value.status_code == 401
    assert error_body(info.value)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        gateway.openai(api_key="wrong").models.list()
    missing = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL, "messages": ask("x")})
    assert missing.status_code == 401 and "Authorization" in missing.json()["error"]["message"]
    assert httpx.get(f"{gateway.url}/health").status_code == 200  # health and metrics stay open


def test_admission_full_answers_429_with_retry_after(make_gateway, dataplane):
    dataplane.delay_s = SLOW_DELAY_S
    gateway = make_gateway(max_concurrent_requests=1, max_queued_requests=1, retry_after_s=3)
    client = gateway.openai()
    holder = client.chat.completions.create(model=MODEL, messages=ask("one two"), stream=True, **LONG_GENERATION)
    next(iter(holder))  # admitted and streaming
    queued, queued_result = queue_one_request(gateway)
    assert scrape(gateway.url)[("pagedweight_gateway_requests_running", ())] == 1
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "3"
    assert error_body(info.value)["type"] == "rate_limit_error"
    holder.close()  # frees the slot: the queued request runs
    queued.join(timeout=10)
    assert queued_result == ["Hello"]
    metrics = scrape(gateway.url)
    assert metrics[("pagedweight_gateway_requests_running", ())] == 0
    assert metrics[("pagedweight_gateway_http_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "429")))] == 1


def test_a_request_with_n_choices_holds_n_admission_slots(make_gateway, dataplane):
    dataplane.delay_s = SLOW_DELAY_S
    gateway = make_gateway(max_concurrent_requests=2, max_queued_requests=1)
    client = gateway.openai()
    holder = client.chat.completions.create(model=MODEL, messages=ask("one two"), stream=True, n=2,
                                            **LONG_GENERATION)
    next(iter(holder))
    m = scrape(gateway.url)
    assert m[("pagedweight_gateway_requests_running", ())] == 1
    assert m[("pagedweight_gateway_admission_slots_used", ())] == 2
    queued, queued_result = queue_one_request(gateway)  # one slot is missing
    holder.close()
    queued.join(timeout=10)
    assert queued_result == ["Hello"]


def test_dataplane_down_gives_503_then_recovers(make_gateway, tokenizer):
    port = free_port()
    gateway = make_gateway(dataplane=f"127.0.0.1:{port}", dataplane_wait_s=0.3)
    client = gateway.openai()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=ask("Hello"))
    assert info.value.status_code == 503
    assert error_body(info.value)["code"] == "dataplane_unavailable"
    assert httpx.get(f"{gateway.url}/health").status_code == 503
    assert scrape(gateway.url)[("pagedweight_engine_up", ())] == 0
    late = FakeDataplane(tokenizer, port=port)
    late.start()
    try:
        # The gRPC channel reconnects within its (capped) backoff.
        deadline = time.monotonic() + 5
        while httpx.get(f"{gateway.url}/health").status_code != 200:
            assert time.monotonic() < deadline, "gateway never saw the dataplane come up"
            time.sleep(0.05)
        reply = client.chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0)
        assert reply.choices[0].message.content == "Hello"
    finally:
        late.stop()


def test_request_waits_for_a_dataplane_that_comes_up(make_gateway, tokenizer):
    port = free_port()
    gateway = make_gateway(dataplane=f"127.0.0.1:{port}", dataplane_wait_s=10)
    late = FakeDataplane(tokenizer, port=port)
    starter = threading.Timer(0.5, late.start)
    starter.start()
    try:
        reply = gateway.openai().chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0)
        assert reply.choices[0].message.content == "Hello"
    finally:
        starter.join()
        late.stop()


def test_metrics_expose_histograms_counters_and_engine_stats(gateway, dataplane):
    dataplane.tokens_per_message = 2
    client = gateway.openai()
    reply = client.chat.completions.create(model=MODEL, messages=ask("Hello world"), temperature=0)
    client.chat.completions.create(model=MODEL, messages=ask("Hello world"), temperature=0, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ask("x"), temperature=-1)
    m = scrape(gateway.url)
    generated = reply.usage.completion_tokens + 1
    assert m[("pagedweight_gateway_time_to_first_token_seconds_count", ())] == 2
    assert m[("pagedweight_gateway_time_to_first_token_seconds_bucket", (("le", "+Inf"),))] == 2
    # Tokens after each sequence's first message (2 tokens per message here).
    assert m[("pagedweight_gateway_inter_token_latency_seconds_count", ())] == reply.usage.completion_tokens - 2
    assert m[("pagedweight_gateway_request_latency_seconds_count", ())] == 2
    assert m[("pagedweight_gateway_prompt_tokens_total", ())] == 2 * reply.usage.prompt_tokens
    assert m[("pagedweight_gateway_generation_tokens_total", ())] == generated
    assert m[("pagedweight_gateway_sequences_finished_total", (("finish_reason", "stop"),))] == 1
    assert m[("pagedweight_gateway_sequences_finished_total", (("finish_reason", "length"),))] == 1
    chat = "/v1/chat/completions"
    assert m[("pagedweight_gateway_http_requests_total", (("endpoint", chat), ("status", "200")))] == 2
    assert m[("pagedweight_gateway_http_requests_total", (("endpoint", chat), ("status", "400")))] == 1
    assert m[("pagedweight_engine_up", ())] == 1
    assert m[("pagedweight_engine_kv_blocks_used", ())] == 7
    assert m[("pagedweight_engine_kv_blocks_free", ())] == 41
    assert m[("pagedweight_engine_arena_pages_free", ())] == 200
    assert m[("pagedweight_engine_arena_pages_kv", ())] == 56
    assert m[("pagedweight_engine_arena_pages_weights", (("bits", "4"),))] == 96
    assert m[("pagedweight_engine_arena_pages_weights", (("bits", "8"),))] == 160
    assert m[("pagedweight_engine_preemptions_total", ())] == 3
    assert m[("pagedweight_engine_kernel_compiles_total", ())] == 2


def test_metrics_registries_are_per_app(make_gateway):
    first, second = make_gateway(), make_gateway()
    first.openai().chat.completions.create(model=MODEL, messages=ask("Hello"), temperature=0)
    assert scrape(first.url)[("pagedweight_gateway_request_latency_seconds_count", ())] == 1
    assert scrape(second.url)[("pagedweight_gateway_request_latency_seconds_count", ())] == 0


def test_stream_disconnect_cancels_at_dataplane(gateway, dataplane):
    dataplane.delay_s = SLOW_DELAY_S
    stream = gateway.openai().chat.completions.create(
        model=MODEL, messages=ask("one two"), stream=True, **LONG_GENERATION
    )
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert len(dataplane.snapshot()[1]) == 1  # running at the dataplane
    stream.close()
    assert dataplane.wait_until(lambda d: len(d.snapshot()[2]) == 1 and not d.snapshot()[1])
    assert dataplane.snapshot()[3] == []  # it never finished on its own
    assert scrape(gateway.url)[("pagedweight_gateway_requests_running", ())] == 0


def test_non_streaming_disconnect_cancels_at_dataplane(gateway, dataplane):
    dataplane.delay_s = SLOW_DELAY_S
    impatient = gateway.openai(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=MODEL, messages=ask("one two"), n=2, **LONG_GENERATION)
    assert dataplane.wait_until(lambda d: len(d.snapshot()[2]) == 2 and not d.snapshot()[1])
    assert dataplane.snapshot()[3] == []
    m = scrape(gateway.url)
    assert m[("pagedweight_gateway_requests_running", ())] == 0
    assert m[("pagedweight_gateway_sequences_finished_total", (("finish_reason", "cancelled"),))] == 2


def test_dataplane_errors_map_to_http(gateway, dataplane):
    client = gateway.openai()
    client.models.list()  # model info cached while healthy
    dataplane.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=ask("Hello"))
    assert info.value.status_code == 503 and error_body(info.value)["code"] == "engine_overloaded"
    with pytest.raises(openai.APIError) as streamed:
        list(client.chat.completions.create(model=MODEL, messages=ask("Hello"), stream=True))
    assert "overloaded" in streamed.value.message
    dataplane.fail_with = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ask("Hello"))


def test_unknown_route_is_openai_shaped(gateway):
    response = httpx.get(f"{gateway.url}/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    bad_json = httpx.post(
        f"{gateway.url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "Invalid JSON" in bad_json.json()["error"]["message"]
