"""The chat completions HTTP messages: the request (messages, tools), the
response, the stream chunks and chat's log-probability shape. What chat and
text completions share is in gateway/protocol.py.

Tools: a call the request forces (`tool_choice` "required" or a named
function) is generated inside a JSON grammar, so it is always a well-formed
call of a given tool (`ChatCompletionRequest.output_grammar`). `auto` needs a
model that writes calls in a format of its own, which the served models do
not have; it is refused (400), as are the legacy `functions`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from gateway.protocol import MAX_TOP_LOGPROBS, ChatMessage, SamplingRequest, Usage

# A chat choice also ends with the forced tool call written.
ChatFinishReason = Literal["stop", "length", "tool_calls"]
# Most tools one request may declare.
MAX_TOOLS = 128
# Any JSON object: the arguments of a function without a parameters schema.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None  # calls follow the schema either way


class ChatTool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SetFieldsOnly(BaseModel):
    """A stream delta: only the fields that are set appear on the wire."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunctionCall(SetFieldsOnly):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(SetFieldsOnly):
    """A streamed tool call: its first chunk has id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ChatTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # one call per choice is generated either way
    functions: list[Any] | None = None  # the legacy form of tools
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _reject_unsupported(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        if self.functions:
            raise ValueError("functions (the legacy form of tools) are not supported; use tools")
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if self.tools and choice in (None, "auto"):
            raise ValueError(
                "tool_choice 'auto' is not supported: the served model has no format of its own for tool calls; "
                "use 'required' or name a function"
            )
        if isinstance(choice, NamedToolChoice) and choice.function.name not in self._tools_by_name():
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools")
        if self.forced_tool_call() and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("response_format cannot be combined with a forced tool call")
        if any(modality != "text" for modality in self.modalities or ()) or self.audio:
            raise ValueError("only text output is supported")
        return self

    def forced_tool_call(self) -> bool:
        """The answer is a tool call (tool_choice "required" or a named function)."""
        return bool(self.tools) and self.tool_choice not in (None, "none", "auto")

    def named_tool(self) -> str | None:
        """The function tool_choice names, if it names one."""
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def output_grammar(self) -> dict[str, Any] | None:
        """A named function: its arguments object. "required": one call of
        any tool, {"name": ..., "arguments": {...}}. Else response_format's."""
        if not self.forced_tool_call():
            return super().output_grammar()
        tools = self._tools_by_name()
        named = self.named_tool()
        if named is not None:
            return tools[named].parameters or ANY_OBJECT
        return {"anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": function.parameters or ANY_OBJECT},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, function in tools.items()
        ]}

    def tools_for_template(self) -> list[dict[str, Any]] | None:
        """The tools as a chat template reads them; None when none may be called."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def _tools_by_name(self) -> dict[str, FunctionDefinition]:
        return {tool.function.name: tool.function for tool in self.tools or ()}

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per generated token when logprobs were asked for, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens (current name) wins over max_tokens (legacy)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _no_empty_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        body = handler(self)
        if body.get("tool_calls") is None:
            body.pop("tool_calls", None)
        return body


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
    finish_reason: ChatFinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(SetFieldsOnly):
    """`{}` for a final chunk."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: ChatFinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
