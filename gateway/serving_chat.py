"""POST /v1/chat/completions: the conversation rendered with the model's chat
template, and the two response shapes (one JSON body, or SSE chunks ending
with `data: [DONE]`). The context-length policy and the running of choices
are shared with text completions (gateway/generation.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

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
)
from gateway.sequence import SequenceDelta


class ChatService:
    """Prompt building and response assembly of chat completions; one per app."""

    def __init__(self, generation: GenerationService) -> None:
        self._generation = generation

    async def prepare(self, body: ChatCompletionRequest) -> PreparedGeneration:
        """Validates `body` against the model and tokenizes the prompt."""
        arrival_s = time.monotonic()
        model = await self._generation.model_for(body.model)
        try:
            prompt = model.render_prompt([m.for_template() for m in body.messages])
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
        return self._generation.prepare(
            "chatcmpl", body, [plan], model, arrival_s,
            detokenizer_context=False, top_logprobs=body.top_logprobs_wanted(),
        )

    async def complete(
        self, chat: PreparedGeneration, disconnected: Callable[[], Awaitable[None]]
    ) -> ChatCompletion:
        """Non-streaming answer. Raises APIError, or ClientDisconnected."""
        collected = await self._generation.collect(chat, disconnected)
        choices = [
            Choice(
                index=i,
                message=AssistantMessage(content=text),
                finish_reason=reason,
                logprobs=chat_logprobs(collected.logprobs[i], chat.tokenizer) if chat.logprobs else None,
            )
            for i, (text, reason) in enumerate(zip(collected.texts, collected.finish_reasons, strict=True))
        ]
        usage = self._generation.usage(chat, collected.completion_tokens, collected.cached_prompt_tokens)
        return ChatCompletion(id=chat.id, created=chat.created, model=chat.model, choices=choices, usage=usage)

    def stream(self, chat: PreparedGeneration, disconnected: Callable[[], Awaitable[None]]) -> AsyncIterator[str]:
        """SSE events: a role chunk per choice, then content chunks (with
        their tokens' logprobs when asked for)."""

        def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=chat.id, created=chat.created, model=chat.model, choices=choices, usage=usage)

        def chunk_of(delta: SequenceDelta) -> ChatCompletionChunk:
            content = Delta(content=delta.text) if delta.text else Delta()
            logprobs = chat_logprobs(delta.logprobs, chat.tokenizer) if chat.logprobs else None
            return chunk([ChunkChoice(index=delta.index, delta=content, finish_reason=delta.finish_reason,
                                      logprobs=logprobs)])

        opening = [
            chunk([ChunkChoice(index=spec.index, delta=Delta(role="assistant", content=""))]) for spec in chat.sequences
        ]
        return self._generation.sse_events(chat, disconnected, opening, chunk_of, lambda usage: chunk([], usage))
