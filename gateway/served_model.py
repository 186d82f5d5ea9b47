"""Everything the gateway knows about the served model, built from the
dataplane's `ModelInfo`: name, limits, tokenizer, chat template, EOS ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.chat_template import ChatTemplate, ChatTemplateError
from gateway.tokenizer import TextTokenizer
from pagedweight.v1 import inference_pb2


@dataclass(frozen=True)
class ServedModel:
    name: str
    context_length: int
    tokenizer: TextTokenizer
    # None when the model ships no chat template; chat requests then fail.
    template: ChatTemplate | None
    eos_token_ids: frozenset[int]
    family: str

    @classmethod
    def from_info(cls, info: inference_pb2.ModelInfo, name_override: str | None) -> ServedModel:
        """Raises ValueError when the dataplane sent an unusable description."""
        if info.context_length < 2:
            raise ValueError(f"dataplane reports context_length={info.context_length}")
        template = None
        if info.chat_template.strip():
            template = ChatTemplate(info.chat_template, info.bos_token, info.eos_token)
        return cls(
            name=name_override or info.model_name,
            context_length=info.context_length,
            tokenizer=TextTokenizer.from_json(info.tokenizer_json),
            template=template,
            eos_token_ids=frozenset(info.eos_token_ids),
            family=info.family,
        )

    def render_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Raises ChatTemplateError (the client's fault or the template's)."""
        if self.template is None:
            raise ChatTemplateError("the served model has no chat template")
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
