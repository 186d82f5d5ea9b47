"""Renders conversations with the model's Jinja2 chat template, sandboxed.

Templates come from the model (tokenizer_config.json) but render user text, so
they run in jinja2's ImmutableSandboxedEnvironment (made strict: touching an
unsafe attribute is an error): no access to dunder attributes, no mutation of
passed-in objects, bounded `range`. Variables
provided, as Hugging Face templates expect: `messages`,
`add_generation_prompt`, `tools`, `bos_token`, `eos_token`, and the function
`raise_exception(message)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template could not be compiled or refused to render the input.

    The message is safe to show to the client (it is the template's own
    `raise_exception` text or jinja2's description of what failed).
    """


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """jinja2's sandbox answers an unsafe attribute (e.g. `__class__`) with an
    undefined value that renders as nothing; here it is an error at once, so
    a probing template fails loudly instead of rendering a wrong prompt."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe.")


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # Like Hugging Face: keep non-ASCII text readable inside prompts.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; `render` is safe to call concurrently."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        if not source.strip():
            raise ChatTemplateError("the served model has no chat template")
        env = _StrictSandbox(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages` (dicts with at least role/content);
        `tools` as Hugging Face templates read them (None: no tools)."""
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) if tools is not None else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template error: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
            raise ChatTemplateError(f"chat template failed on this input: {exc}") from exc
