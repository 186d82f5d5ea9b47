"""End to end: client -> gateway -> dataplane -> model -> back, with telemetry
to the controlplane; three real processes, real gRPC and HTTP, the official
openai client."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
import urllib.request

import grpc
import httpx
import openai
import pytest

from pagedweight.v1 import admin_pb2, admin_pb2_grpc
from tokenizers import Tokenizer

from e2e_stack import ADMIN_TOKEN, DEFAULT_MODEL

TIMEOUT_S = 120.0
CONCURRENT_REQUESTS = 16
CANCEL_ATTEMPTS = 3
USER_MESSAGE = [{"role": "user", "content": "Write a Python function that reverses a list."}]


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def model_name(stack) -> str:
    return client(stack).models.list().data[0].id


def metrics(stack, *names: str) -> list[float]:
    """Unlabelled samples of the gateway's /metrics, all from one scrape."""
    with urllib.request.urlopen(f"{stack.cfg.gateway_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = []
    for name in names:
        match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        assert match, f"{name} not in /metrics"
        values.append(float(match.group(1)))
    return values


def metric(stack, name: str) -> float:
    """One unlabelled sample of the gateway's /metrics."""
    return metrics(stack, name)[0]


def admin_stub(stack):
    channel = grpc.insecure_channel(stack.cfg.controlplane_address)
    return channel, admin_pb2_grpc.AdminStub(channel)


AUTH = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def test_chat_completion_returns_text_and_usage(stack):
    reply = client(stack).chat.completions.create(
        model=model_name(stack), messages=USER_MESSAGE, max_tokens=24, temperature=0
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 24
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_matches_non_streaming_and_reports_usage(stack):
    name = model_name(stack)
    whole = client(stack).chat.completions.create(model=name, messages=USER_MESSAGE, max_tokens=20, temperature=0)
    stream = client(stack).chat.completions.create(
        model=name, messages=USER_MESSAGE, max_tokens=20, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_text_completion_continues_the_prompt_of_the_base_model(stack):
    # The default model is a base model: /v1/completions continues raw text,
    # with the tokenizer's BOS in front and no chat template.
    name, prompt = model_name(stack), "def parse(text):\n    "
    whole = client(stack).completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0)
    bos_and_prompt = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json")).encode(prompt).ids
    assert bos_and_prompt[0] == 1 and whole.usage.prompt_tokens == len(bos_and_prompt)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert 0 < whole.usage.completion_tokens <= 16
    stream = client(stack).completions.create(
        model=name, prompt=prompt, max_tokens=16, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == prompt + whole.choices[0].text


def test_logit_bias_forces_a_token_through_the_api(stack):
    tokenizer = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    forced = tokenizer.encode(" x", add_special_tokens=False).ids[-1]
    reply = client(stack).completions.create(
        model=model_name(stack), prompt="import os\n", max_tokens=5, temperature=0.9, seed=3,
        logit_bias={str(forced): 100}, extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].text == tokenizer.decode([forced] * 5)


def test_a_shared_system_prompt_is_served_from_the_prefix_cache(stack):
    name = model_name(stack)
    system = {"role": "system", "content": "You answer questions about Python lists, briefly and exactly. " * 4}
    before = metric(stack, "pagedweight_engine_prefix_cached_tokens_total")
    first = client(stack).chat.completions.create(
        model=name, messages=[system, {"role": "user", "content": "How do I reverse a list?"}], max_tokens=4,
        temperature=0)
    second = client(stack).chat.completions.create(
        model=name, messages=[system, {"role": "user", "content": "How do I sort a list?"}], max_tokens=4,
        temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    block = metric(stack, "pagedweight_engine_kv_block_size_tokens")
    # At least the system prompt's whole blocks; never the whole prompt.
    assert first.usage.prompt_tokens // block * block >= cached >= 3 * block
    assert cached % block == 0 and cached < second.usage.prompt_tokens
    assert metric(stack, "pagedweight_engine_prefix_cached_tokens_total") - before >= cached


def test_response_format_json_schema_gives_json_that_follows_it(stack):
    schema = {"type": "object", "properties": {"lang": {"enum": ["python", "c", "german"]}, "ok": {"type": "boolean"}},
              "required": ["lang", "ok"], "additionalProperties": False}
    replies = [client(stack).chat.completions.create(
        model=model_name(stack), messages=USER_MESSAGE, max_tokens=40, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    ) for seed in range(3)]
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        value = json.loads(reply.choices[0].message.content)
        assert set(value) == {"lang", "ok"} and value["lang"] in {"python", "c", "german"}
        assert isinstance(value["ok"], bool)
    with pytest.raises(openai.BadRequestError):
        client(stack).chat.completions.create(
            model=model_name(stack), messages=USER_MESSAGE, max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nope"}}},
        )


def test_forced_tool_calls_are_well_formed_calls_of_the_tools(stack):
    tools = [
        {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"lang": {"enum": ["python", "c"]}}, "required": ["lang"],
            "additionalProperties": False}}},
        {"type": "function", "function": {"name": "stop_here", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": False}}},
    ]
    named = client(stack).chat.completions.create(
        model=model_name(stack), messages=USER_MESSAGE, tools=tools, max_tokens=40, temperature=0,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    )
    (call,) = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"
    assert json.loads(call.function.arguments)["lang"] in {"python", "c"}
    for seed in range(3):
        required = client(stack).chat.completions.create(
            model=model_name(stack), messages=USER_MESSAGE, tools=tools, max_tokens=40, temperature=1.0, seed=seed,
            tool_choice="required",
        )
        (call,) = required.choices[0].message.tool_calls
        assert call.function.name in {"lookup", "stop_here"}
        assert isinstance(json.loads(call.function.arguments), dict)


def test_logprobs_of_greedy_tokens_are_the_most_likely(stack):
    name = model_name(stack)
    chat = client(stack).chat.completions.create(
        model=name, messages=USER_MESSAGE, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert 0 < len(content) <= chat.usage.completion_tokens
    for entry in content:
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and values[0] <= 0
        assert entry.logprob == pytest.approx(values[0], abs=1e-5)  # greedy takes the most likely token
    text = client(stack).completions.create(model=name, prompt="import os\n", max_tokens=8, temperature=0, logprobs=2)
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) > 0
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert value == pytest.approx(max(top.values()), abs=1e-5) and top[token] == pytest.approx(value, abs=1e-5)


def test_echoed_prompt_logprobs_score_what_was_generated(stack):
    # Scoring a text (echo + logprobs, as evaluation harnesses do) gives the
    # generated tokens the log-probabilities they had when generated.
    name = model_name(stack)
    generated = client(stack).completions.create(
        model=name, prompt="import os\n", max_tokens=4, temperature=0, logprobs=0
    ).choices[0].logprobs
    prompt_ids = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json")).encode("import os\n").ids
    scored = client(stack).completions.create(
        model=name, prompt="import os\n" + "".join(generated.tokens), max_tokens=1, temperature=0, echo=True,
        logprobs=0,
    ).choices[0].logprobs
    assert scored.token_logprobs[0] is None and scored.tokens[0] == ""  # the BOS the tokenizer adds: no text
    assert "".join(scored.tokens[: len(prompt_ids)]) == "import os\n"
    tail = scored.token_logprobs[len(prompt_ids) : len(prompt_ids) + len(generated.tokens)]
    assert scored.tokens[len(prompt_ids) : len(prompt_ids) + len(generated.tokens)] == generated.tokens
    assert tail == pytest.approx(generated.token_logprobs, abs=2e-3)


def test_greedy_output_is_deterministic(stack):
    name = model_name(stack)
    replies = [
        client(stack).chat.completions.create(model=name, messages=USER_MESSAGE, max_tokens=16, temperature=0)
        .choices[0].message.content
        for _ in range(2)
    ]
    assert replies[0] == replies[1]


def test_sixteen_concurrent_requests_complete(stack):
    name = model_name(stack)

    def one(i: int) -> int:
        reply = client(stack).chat.completions.create(
            model=name, messages=[{"role": "user", "content": f"Request number {i}: print hello."}],
            max_tokens=12, temperature=0.8, seed=i,
        )
        return reply.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        counts = list(pool.map(one, range(CONCURRENT_REQUESTS)))
    assert len(counts) == CONCURRENT_REQUESTS and all(0 < c <= 12 for c in counts)


def test_cancelled_stream_frees_its_kv_blocks(stack):
    # The engine does not wait for the client: on a loaded machine the test
    # process can be descheduled while all the tokens are generated and
    # buffered. A request that finished before the cancel tests nothing, so
    # it is tried again (a finished count read in the same scrape tells).
    for _ in range(CANCEL_ATTEMPTS):
        before = metrics(stack, "pagedweight_engine_aborted_requests_total", "pagedweight_engine_finished_requests_total")
        with httpx.stream(
            "POST", f"{stack.cfg.gateway_url}/v1/chat/completions", timeout=TIMEOUT_S,
            json={"model": model_name(stack), "messages": USER_MESSAGE, "max_tokens": 400,
                  "stream": True, "ignore_eos": True},
        ) as response:
            assert response.status_code == 200
            seen = 0
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen >= 3:
                    break
            kv_blocks, finished = metrics(
                stack, "pagedweight_engine_kv_blocks_used", "pagedweight_engine_finished_requests_total"
            )
        if finished == before[1]:
            break  # still running when cancelled: the case under test
    else:
        pytest.fail(f"every one of {CANCEL_ATTEMPTS} requests finished before it could be cancelled")
    assert kv_blocks > 0
    deadline = time.monotonic() + 30
    while metric(stack, "pagedweight_engine_aborted_requests_total") <= before[0]:
        assert time.monotonic() < deadline, "the dataplane never saw the cancellation"
        time.sleep(0.1)
    while metric(stack, "pagedweight_engine_kv_blocks_used") > 0:
        assert time.monotonic() < deadline, "KV blocks not freed after the cancel"
        time.sleep(0.1)


def test_bad_requests_get_openai_shaped_400(stack):
    url = f"{stack.cfg.gateway_url}/v1/chat/completions"
    missing = httpx.post(url, json={"model": model_name(stack)}, timeout=TIMEOUT_S)
    assert missing.status_code == 400
    error = missing.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    too_long = httpx.post(
        url, timeout=TIMEOUT_S,
        json={"model": model_name(stack), "messages": [{"role": "user", "content": "word " * 5000}]},
    )
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert "context" in too_long.json()["error"]["message"]


def test_telemetry_reaches_the_controlplane(stack):
    client(stack).chat.completions.create(model=model_name(stack), messages=USER_MESSAGE, max_tokens=8)
    channel, admin = admin_stub(stack)
    with channel:
        deadline = time.monotonic() + 30
        while True:
            status = admin.GetStatus(admin_pb2.GetStatusRequest(), metadata=AUTH, timeout=10)
            planes = [d for d in status.dataplanes if d.connected]
            if planes and sum(planes[0].activity) > 0 and planes[0].engine.generated_tokens_total > 0:
                break
            assert time.monotonic() < deadline, f"no telemetry in status: {status}"
            time.sleep(0.2)
        dp = planes[0]
        assert len(dp.block_bits) == dp.num_layers * dp.num_experts * 3
        assert set(dp.block_bits) <= {0, 2, 3, 4, 6, 8}
        assert dp.total_pages > 0


def test_admin_floor_survives_controlplane_restart_and_serving_goes_on(stack):
    channel, admin = admin_stub(stack)
    with channel:
        floor = admin_pb2.QualityFloor(scope=admin_pb2.FloorScope(layer=1), min_bits=4)
        admin.SetQualityFloor(admin_pb2.SetQualityFloorRequest(floor=floor), metadata=AUTH, timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            admin.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stack.stop_one("controlplane")
    # The dataplane keeps serving while the controlplane is away.
    reply = client(stack).chat.completions.create(model=model_name(stack), messages=USER_MESSAGE, max_tokens=8)
    assert reply.usage.completion_tokens > 0
    stack.start_controlplane()
    channel, admin = admin_stub(stack)
    with channel:
        floors = admin.ListQualityFloors(admin_pb2.ListQualityFloorsRequest(), metadata=AUTH, timeout=10).floors
        assert [(f.scope.layer, f.min_bits) for f in floors] == [(1, 4)]
        # The dataplane reconnects (backoff) and registers again.
        deadline = time.monotonic() + 30
        while not any(
            d.connected for d in admin.GetStatus(admin_pb2.GetStatusRequest(), metadata=AUTH, timeout=10).dataplanes
        ):
            assert time.monotonic() < deadline, "dataplane did not reconnect"
            time.sleep(0.2)
