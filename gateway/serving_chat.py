"""POST /v1/chat/completions: validation against the model, prompt building,
fan-out of n choices to the dataplane, and the two response shapes
(one JSON body, or SSE chunks ending with `data: [DONE]`).

Context-length policy (documented choice, same as OpenAI and vLLM): a prompt
of context_length tokens or more is rejected; an explicit max_tokens with
prompt + max_tokens > context_length is rejected (400,
code "context_length_exceeded") rather than silently clamped, so the client
learns the real limit; without max_tokens the completion may use the whole
remaining context.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.chat_template import ChatTemplateError
from gateway.dataplane_client import DataplaneClient, DataplaneError
from gateway.errors import context_length_exceeded, dataplane_api_error, internal, invalid_request, model_not_found
from gateway.fanout import ClientDisconnected, merge_streams
from gateway.metrics import GatewayMetrics
from gateway.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    Usage,
)
from gateway.sequence import SequenceDelta, SequenceSpec, generate_sequence
from gateway.served_model import ServedModel
from pagedweight.v1 import inference_pb2

SSE_DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class PreparedChat:
    """A validated request, ready to generate."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    sequences: list[SequenceSpec]
    include_usage: bool
    arrival_s: float  # time.monotonic()
    deadline_s: float  # time.monotonic() by which generation must end


class ChatService:
    """Policy and assembly of chat completions; one per app."""

    def __init__(
        self,
        client: DataplaneClient,
        metrics: GatewayMetrics,
        request_timeout_s: float,
        model_name_override: str | None,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._request_timeout_s = request_timeout_s
        self._name_override = model_name_override
        self._model: ServedModel | None = None
        self._model_lock = asyncio.Lock()

    async def served_model(self) -> ServedModel:
        """The model description (cached); raises APIError 503 when the
        dataplane cannot be reached."""
        if self._model is not None:
            return self._model
        async with self._model_lock:
            if self._model is None:
                try:
                    info = await self._client.model_info()
                except DataplaneError as error:
                    raise dataplane_api_error(error) from error
                try:
                    # Building a large tokenizer takes a while: off the event loop.
                    self._model = await asyncio.to_thread(ServedModel.from_info, info, self._name_override)
                except ValueError as error:
                    raise internal(f"unusable model description from the dataplane: {error}") from error
            return self._model

    async def prepare(self, body: ChatCompletionRequest) -> PreparedChat:
        """Validates `body` against the model and tokenizes the prompt."""
        arrival_s = time.monotonic()
        model = await self.served_model()
        if body.model != model.name:
            raise model_not_found(body.model)
        messages = [{**m.model_dump(exclude_none=True), "content": m.text() or ""} for m in body.messages]
        try:
            prompt = model.render_prompt(messages)
        except ChatTemplateError as error:
            raise invalid_request(str(error), param="messages") from error
        prompt_ids = model.tokenizer.encode(prompt)
        if not prompt_ids:
            raise invalid_request("the rendered prompt is empty", param="messages")
        context = model.context_length
        if len(prompt_ids) >= context:
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens. However, your messages resulted in "
                f"{len(prompt_ids)} tokens. Please reduce the length of the messages."
            )
        max_tokens = body.requested_max_tokens()
        if max_tokens is None:
            max_tokens = context - len(prompt_ids)
        elif len(prompt_ids) + max_tokens > context:
            param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            raise context_length_exceeded(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in "
                f"the completion). Please reduce the length of the messages or completion.",
                param=param,
            )
        stop_ids = frozenset(body.stop_token_ids or ()) | (frozenset() if body.ignore_eos else model.eos_token_ids)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        sequences = []
        for index in range(body.n):
            sampling = inference_pb2.SamplingParams(
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=max(body.top_k, 0),
                max_tokens=max_tokens,
                stop_token_ids=list(body.stop_token_ids or ()),
                ignore_eos=body.ignore_eos,
            )
            if body.seed is not None:
                sampling.seed = body.seed + index  # choice i uses seed + i
            request = inference_pb2.GenerateRequest(
                request_id=f"{request_id}-{index}", prompt_token_ids=prompt_ids, sampling=sampling
            )
            sequences.append(SequenceSpec(index, request, body.stop_strings(), stop_ids))
        return PreparedChat(
            id=request_id,
            created=int(time.time()),
            model=model.name,
            prompt_tokens=len(prompt_ids),
            sequences=sequences,
            include_usage=body.include_usage(),
            arrival_s=arrival_s,
            deadline_s=arrival_s + self._request_timeout_s,
        )

    def _deltas(
        self, chat: PreparedChat, model: ServedModel, disconnected: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[SequenceDelta]:
        self._metrics.prompt_tokens.inc(chat.prompt_tokens)
        timeout_s = max(chat.deadline_s - time.monotonic(), 0.0)
        streams = [
            generate_sequence(spec, self._client, model.tokenizer, self._metrics, chat.arrival_s, timeout_s)
            for spec in chat.sequences
        ]
        return merge_streams(streams, disconnected)

    async def complete(self, chat: PreparedChat, disconnected: Callable[[], Awaitable[None]]) -> ChatCompletion:
        """Non-streaming answer. Raises APIError, or ClientDisconnected (all
        dataplane requests are cancelled before it propagates)."""
        model = await self.served_model()
        n = len(chat.sequences)
        texts: list[list[str]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        tokens = [0] * n
        try:
            async for delta in self._deltas(chat, model, disconnected):
                texts[delta.index].append(delta.text)
                tokens[delta.index] = delta.completion_tokens
                reasons[delta.index] = delta.finish_reason or reasons[delta.index]
        except DataplaneError as error:
            raise dataplane_api_error(error) from error
        finally:
            self._metrics.request_latency.observe(time.monotonic() - chat.arrival_s)
        choices = [
            Choice(index=i, message=AssistantMessage(content="".join(texts[i])), finish_reason=reasons[i] or "stop")
            for i in range(n)
        ]
        return ChatCompletion(
            id=chat.id, created=chat.created, model=chat.model, choices=choices, usage=self._usage(chat, tokens)
        )

    async def stream(self, chat: PreparedChat, disconnected: Callable[[], Awaitable[None]]) -> AsyncIterator[str]:
        """SSE events. A dataplane error after the 200 header is sent as an
        `error` event followed by [DONE]; a disconnect ends the stream quietly."""
        model = await self.served_model()
        tokens = [0] * len(chat.sequences)
        try:
            for spec in chat.sequences:
                yield self._chunk(chat, ChunkChoice(index=spec.index, delta=Delta(role="assistant", content="")))
            async for delta in self._deltas(chat, model, disconnected):
                tokens[delta.index] = delta.completion_tokens
                content = Delta(content=delta.text) if delta.text else Delta()
                yield self._chunk(
                    chat, ChunkChoice(index=delta.index, delta=content, finish_reason=delta.finish_reason)
                )
        except ClientDisconnected:
            return  # nobody is listening; the dataplane requests are cancelled
        except DataplaneError as error:
            yield f"data: {dataplane_api_error(error).body().model_dump_json()}\n\n"
            yield SSE_DONE
            return
        finally:
            self._metrics.request_latency.observe(time.monotonic() - chat.arrival_s)
        if chat.include_usage:
            usage_chunk = ChatCompletionChunk(
                id=chat.id, created=chat.created, model=chat.model, choices=[], usage=self._usage(chat, tokens)
            )
            yield f"data: {usage_chunk.model_dump_json()}\n\n"
        yield SSE_DONE

    @staticmethod
    def _chunk(chat: PreparedChat, choice: ChunkChoice) -> str:
        chunk = ChatCompletionChunk(id=chat.id, created=chat.created, model=chat.model, choices=[choice])
        # Like OpenAI: "usage": null on content chunks only when usage was asked for.
        return f"data: {chunk.model_dump_json(exclude=None if chat.include_usage else {'usage'})}\n\n"

    @staticmethod
    def _usage(chat: PreparedChat, completion_tokens: list[int]) -> Usage:
        # OpenAI counts the prompt once however many choices were generated.
        total = sum(completion_tokens)
        return Usage(prompt_tokens=chat.prompt_tokens, completion_tokens=total, total_tokens=chat.prompt_tokens + total)
