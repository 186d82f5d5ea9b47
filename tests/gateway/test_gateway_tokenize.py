"""/tokenize and /detokenize over real HTTP: the ids the completion endpoints
send to the dataplane, and back to text; errors OpenAI-shaped."""

from __future__ import annotations

import httpx

from tests.gateway.fake_dataplane import MODEL_NAME, VOCAB_SIZE

MODEL = MODEL_NAME


def post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, timeout=10)


def test_tokenize_gives_what_the_completion_endpoints_send(gateway, dataplane):
    messages = [{"role": "user", "content": "Hello world"}]
    chat = post(gateway, "/tokenize", {"model": MODEL, "messages": messages}).json()
    text = post(gateway, "/tokenize", {"model": MODEL, "prompt": "one two three"}).json()
    client = gateway.openai()
    client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=1)
    client.completions.create(model=MODEL, prompt="one two three", temperature=0, max_tokens=1)
    sent = [list(r.prompt_token_ids) for r in dataplane.snapshot()[0]]
    assert sent == [chat["tokens"], text["tokens"]]
    assert chat["count"] == len(chat["tokens"]) and chat["max_model_len"] == 256
    without_prompt = post(gateway, "/tokenize", {"model": MODEL, "messages": messages, "add_generation_prompt": False})
    assert without_prompt.json()["tokens"] == chat["tokens"][: without_prompt.json()["count"]]
    assert without_prompt.json()["count"] < chat["count"]


def test_detokenize_round_trip_and_errors(gateway):
    tokens = post(gateway, "/tokenize", {"model": MODEL, "prompt": "The quick brown fox"}).json()["tokens"]
    assert post(gateway, "/detokenize", {"model": MODEL, "tokens": tokens}).json() == {"prompt": "The quick brown fox"}
    for path, body, status in [
        ("/detokenize", {"model": MODEL, "tokens": [VOCAB_SIZE + 3]}, 400),
        ("/tokenize", {"model": MODEL}, 400),
        ("/tokenize", {"model": MODEL, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "tool-x", "content": "b"}]}, 400),
        ("/tokenize", {"model": "other", "prompt": "a"}, 404),
    ]:
        reply = post(gateway, path, body)
        assert reply.status_code == status, body
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_tokenize_needs_the_api_key(make_gateway):
    gateway = make_gateway(api_keys=["sk-test"])
    assert post(gateway, "/tokenize", {"model": MODEL, "prompt": "a"}).status_code == 401
    reply = httpx.post(f"{gateway.url}/tokenize", json={"model": MODEL, "prompt": "a"},
                       headers={"Authorization": "Bearer sk-test"}, timeout=10)
    assert reply.status_code == 200 and reply.json()["count"] >= 1
