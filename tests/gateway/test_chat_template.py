"""The chat template renders conversations and stays inside its sandbox."""

from __future__ import annotations

import openai
import pytest

from gateway.chat_template import ChatTemplate, ChatTemplateError
from gateway.config import GatewaySettings
from tests.gateway.fake_dataplane import CHAT_TEMPLATE, MODEL_NAME, FakeDataplane
from tests.gateway.harness import RunningGateway


def test_renders_messages_with_special_tokens():
    template = ChatTemplate(CHAT_TEMPLATE, bos_token="<s>", eos_token="</s>")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert template.render(messages) == "<s><|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>"
    assert template.render(messages, add_generation_prompt=False).endswith("Hi<|end|>")


def test_raise_exception_reaches_the_caller():
    template = ChatTemplate(CHAT_TEMPLATE, "<s>", "</s>")
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        template.render([{"role": "robot", "content": "beep"}])


def test_tojson_keeps_unicode():
    template = ChatTemplate("{{ messages[0]['content'] | tojson }}")
    assert template.render([{"role": "user", "content": "日本"}]) == '"日本"'


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__base__ }}",
        "{% for m in messages %}{{ m.__class__ }}{% endfor %}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages.__len__ }}",
        "{{ messages.append({'role': 'user'}) }}",  # immutable: no mutation of inputs
        "{{ messages[0].update({'content': 'x'}) }}",
    ],
)
def test_unsafe_templates_fail_safely(source):
    template = ChatTemplate(source, "<s>", "</s>")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match="unsafe|not safely callable|access"):
        template.render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_broken_or_missing_template_is_reported():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate("  ")


def test_hostile_template_from_the_dataplane_gives_400(tokenizer):
    fake = FakeDataplane(tokenizer, chat_template="{{ ''.__class__.__mro__ }}")
    fake.start()
    gateway = RunningGateway(GatewaySettings(dataplane=fake.address)).start()
    try:
        with pytest.raises(openai.BadRequestError) as info:
            gateway.openai().chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}])
        assert "unsafe" in info.value.response.json()["error"]["message"]
        assert fake.snapshot()[0] == []
    finally:
        gateway.stop()
        fake.stop()


MIXTRAL_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def test_real_world_style_template():
    template = ChatTemplate(MIXTRAL_STYLE, "<s>", "</s>")
    turns = [
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    assert template.render(turns) == "<s>[INST] Hi [/INST]Hello.</s>[INST] Again [/INST]"
    with pytest.raises(ChatTemplateError, match="must alternate"):
        template.render(turns[1:])


def test_tools_reach_the_template_as_hugging_face_templates_read_them():
    template = ChatTemplate(
        "{% if tools %}[{% for t in tools %}{{ t.function.name }}{% endfor %}]{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
    assert template.render([{"role": "user", "content": "hi"}], tools=tools) == "[fg]hi"
    assert template.render([{"role": "user", "content": "hi"}]) == "hi"
