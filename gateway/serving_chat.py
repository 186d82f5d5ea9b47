"""POST /v1/chat/completions: the conversation rendered with the model's chat
template, and the two response shapes (one JSON body, or SSE chunks ending
with `data: [DONE]`). The context-length policy and the running of choices
are shared with text completions (gateway/generation.py).

A forced tool call (gateway/protocol_chat.py) is generated as JSON text and
answered as `tool_calls`: a named function's text is its arguments, streamed
as they come; a "required" call's text names the tool, so its call is sent
whole once the text is complete.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.chat_template import ChatTemplateError
from gateway.errors import invalid_request
from gateway.generation import GenerationService, PreparedGeneration, plan_prompt
from gateway.logprobs import chat_logprobs
from gateway.protocol import Usage
from gateway.protocol_chat import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from gateway.sequence import FINISH_STOP, SequenceDelta

FINISH_TOOL_CALLS = "tool_calls"


@dataclass(frozen=True)
class PreparedChat:
    generation: PreparedGeneration
    # The answer is a tool call: of this function (named), or of any tool
    # (tool_choice "required", the name is in the text).
    forced_tool_call: bool = False
    named_tool: str | None = None


def _tool_finish(reason: str | None) -> str | None:
    """A forced call's finish reason: a complete text is a call made."""
    return FINISH_TOOL_CALLS if reason == FINISH_STOP else reason


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_of(text: str, named_tool: str | None) -> ToolCall | None:
    """The call a forced tool call's text makes; None when the text is not a
    complete call (generation stopped by length before "required"'s JSON
    closed). A named call's arguments are the text itself, complete or not."""
    if named_tool is not None:
        return ToolCall(id=_call_id(), function=FunctionCall(name=named_tool, arguments=text))
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        return None
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return ToolCall(id=_call_id(), function=FunctionCall(name=call["name"], arguments=arguments))


class ChatService:
    """Prompt building and response assembly of chat completions; one per app."""

    def __init__(self, generation: GenerationService) -> None:
        self._generation = generation

    async def prepare(self, body: ChatCompletionRequest) -> PreparedChat:
        """Validates `body` against the model and tokenizes the prompt."""
        arrival_s = time.monotonic()
        model = await self._generation.model_for(body.model)
        try:
            prompt = model.render_prompt([m.for_template() for m in body.messages], tools=body.tools_for_template())
        except ChatTemplateError as error:
            raise invalid_request(str(error), param="messages") from error
        # The rendered template already holds the BOS/turn tokens it wants.
        prompt_ids = model.tokenizer.encode(prompt)
        if not prompt_ids:
            raise invalid_request("the rendered prompt is empty", param="messages")
        max_tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        plan = plan_prompt(
            prompt_ids, body.requested_max_tokens(), None, model.context_length, "messages", max_tokens_param
        )
        generation = self._generation.prepare(
            "chatcmpl", body, [plan], model, arrival_s,
            detokenizer_context=False, top_logprobs=body.top_logprobs_wanted(),
        )
        return PreparedChat(generation, body.forced_tool_call(), body.named_tool())

    async def complete(
        self, prepared: PreparedChat, disconnected: Callable[[], Awaitable[None]]
    ) -> ChatCompletion:
        """Non-streaming answer. Raises APIError, or ClientDisconnected."""
        chat = prepared.generation
        collected = await self._generation.collect(chat, disconnected)
        choices = []
        for i, (text, reason) in enumerate(zip(collected.texts, collected.finish_reasons, strict=True)):
            message = AssistantMessage(content=text)
            call = tool_call_of(text, prepared.named_tool) if prepared.forced_tool_call else None
            if call is not None:
                message = AssistantMessage(content=None, tool_calls=[call])
                reason = _tool_finish(reason)
            logprobs = chat_logprobs(collected.logprobs[i], chat.tokenizer) if chat.logprobs else None
            choices.append(Choice(index=i, message=message, finish_reason=reason, logprobs=logprobs))
        usage = self._generation.usage(chat, collected.completion_tokens, collected.cached_prompt_tokens)
        return ChatCompletion(id=chat.id, created=chat.created, model=chat.model, choices=choices, usage=usage)

    def stream(self, prepared: PreparedChat, disconnected: Callable[[], Awaitable[None]]) -> AsyncIterator[str]:
        """SSE events: a role chunk per choice, then content chunks (with
        their tokens' logprobs when asked for), or tool-call chunks."""
        chat = prepared.generation
        held: dict[int, list[str]] = {spec.index: [] for spec in chat.sequences}  # "required" calls' text

        def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=chat.id, created=chat.created, model=chat.model, choices=choices, usage=usage)

        def chunk_of(delta: SequenceDelta) -> ChatCompletionChunk:
            content = Delta(content=delta.text) if delta.text else Delta()
            reason = delta.finish_reason
            if prepared.forced_tool_call:
                content, reason = self._tool_delta(prepared, delta, held[delta.index])
            logprobs = chat_logprobs(delta.logprobs, chat.tokenizer) if chat.logprobs else None
            return chunk([ChunkChoice(index=delta.index, delta=content, finish_reason=reason, logprobs=logprobs)])

        def opening_delta() -> Delta:
            if prepared.named_tool is None:
                return Delta(role="assistant", content=None if prepared.forced_tool_call else "")
            header = DeltaToolCall(index=0, id=_call_id(), type="function",
                                   function=DeltaFunctionCall(name=prepared.named_tool, arguments=""))
            return Delta(role="assistant", tool_calls=[header])

        opening = [chunk([ChunkChoice(index=spec.index, delta=opening_delta())]) for spec in chat.sequences]
        return self._generation.sse_events(chat, disconnected, opening, chunk_of, lambda usage: chunk([], usage))

    @staticmethod
    def _tool_delta(prepared: PreparedChat, delta: SequenceDelta, held: list[str]) -> tuple[Delta, str | None]:
        """A forced call's chunk: a named function's arguments as they come;
        a "required" call held until its text is complete, then sent whole."""
        reason = _tool_finish(delta.finish_reason)
        if prepared.named_tool is not None:
            if not delta.text:
                return Delta(), reason
            return Delta(tool_calls=[DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=delta.text))]), reason
        held.append(delta.text)
        if delta.finish_reason is None:
            return Delta(), None
        call = tool_call_of("".join(held), None)
        if call is None:  # cut by length before the call was complete: the text as it is
            return Delta(content="".join(held)), delta.finish_reason
        whole = DeltaToolCall(index=0, id=call.id, type="function",
                              function=DeltaFunctionCall(name=call.function.name, arguments=call.function.arguments))
        return Delta(tool_calls=[whole]), reason
