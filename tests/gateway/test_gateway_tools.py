"""Forced tool calls over real HTTP with the official client: the grammar sent
to the dataplane, and the text answered as tool_calls (the fake dataplane
echoes the last user message, so the tests choose the generated text)."""

from __future__ import annotations

import json

from tests.gateway.fake_dataplane import MODEL_NAME

MODEL = MODEL_NAME
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_named_function_is_called_with_the_generated_arguments(gateway, dataplane):
    client = gateway.openai()
    reply = client.chat.completions.create(model=MODEL, messages=ask('{"city": "Paris"}'), tools=TOOLS,
                                           tool_choice=NAMED, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    sent = dataplane.snapshot()[0][0].sampling.structured_output
    assert json.loads(sent.json_schema) == WEATHER
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask('{"city": "Oslo"}'), tools=TOOLS,
                                                 tool_choice=NAMED, temperature=0, stream=True))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert all(call.index == 0 and call.function.name is None for call in calls[1:])
    assert json.loads("".join(call.function.arguments for call in calls)) == {"city": "Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_required_calls_one_of_the_tools_named_in_the_text(gateway, dataplane):
    client = gateway.openai()
    text = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    reply = client.chat.completions.create(model=MODEL, messages=ask(text), tools=TOOLS, tool_choice="required",
                                           temperature=0)
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1, "b": 2})
    assert reply.choices[0].finish_reason == "tool_calls"
    schema = json.loads(dataplane.snapshot()[0][0].sampling.structured_output.json_schema)
    assert [option["properties"]["name"]["const"] for option in schema["anyOf"]] == ["get_weather", "add"]
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object"}  # no parameters: any object
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask(text), tools=TOOLS,
                                                 tool_choice="required", temperature=0, stream=True))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert len(calls) == 1 and calls[0].function.name == "add"  # sent whole, once the text is complete
    assert json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}


def test_a_required_call_cut_by_length_comes_back_as_text(gateway, dataplane):
    reply = gateway.openai().chat.completions.create(
        model=MODEL, messages=ask('{"name": "add", "arguments": {"a": 1}}'), tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=3,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None and choice.message.content


def test_tool_choice_none_generates_text_without_a_grammar(gateway, dataplane):
    reply = gateway.openai().chat.completions.create(model=MODEL, messages=ask("hi"), tools=TOOLS,
                                                     tool_choice="none", temperature=0)
    assert reply.choices[0].message.content == "hi" and reply.choices[0].message.tool_calls is None
    assert not dataplane.snapshot()[0][0].sampling.HasField("structured_output")
