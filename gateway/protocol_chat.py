"""The chat completions HTTP messages: the request (messages, tools), the
response, the stream chunks and chat's log-probability shape. What chat and
text completions share is in gateway/protocol.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from gateway.protocol import MAX_TOP_LOGPROBS, ChatMessage, FinishReasonText, SamplingRequest, Usage


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    functions: list[Any] | None = None  # the legacy form of tools
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _reject_unsupported(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        if self.tools or self.functions:
            raise ValueError("tools are not supported")
        if any(modality != "text" for modality in self.modalities or ()) or self.audio:
            raise ValueError("only text output is supported")
        return self

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per generated token when logprobs were asked for, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens (current name) wins over max_tokens (legacy)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    """A token at a position: its text, natural-log probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """A chat choice's (or chunk's) log-probabilities, one entry per token."""

    content: list[ChatTokenLogprob]


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReasonText
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    """Only the fields that are set appear on the wire (`{}` for a final chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReasonText | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
