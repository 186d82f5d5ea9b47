"""The gateway's HTTP messages, but for chat's own (gateway/protocol_chat.py):
what chat and text completions share (sampling, response_format, usage, the
error body), the text completions request and response, the models list and
(de)tokenization (vLLM's extension).

Unknown request fields are ignored (OpenAI clients send optional extras);
known but unsupported features (audio, suffix, legacy functions) are rejected
with 400 so a client never silently gets a different behaviour than it asked
for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    field_validator,
    model_validator,
)

# Most parallel choices one request may ask for (each is one dataplane request).
MAX_CHOICES = 16
# Most stop strings per request.
MAX_STOP_STRINGS = 16
# Seeds are uint64 on the wire and choice i uses seed + i: keep room for that.
MAX_SEED = 2**63 - 1
# OpenAI's bound on presence_penalty and frequency_penalty.
MAX_PENALTY = 2.0
# OpenAI's bounds on logit_bias: one bias, and the tokens one request biases.
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 300
# Most alternatives per position in logprobs (OpenAI's top_logprobs limit;
# the dataplane's too).
MAX_TOP_LOGPROBS = 20


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class TextPart(BaseModel):
    """One part of a multi-part message content; only text is supported."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A conversation message. Extra keys (e.g. tool_calls) reach the template."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str | None:
        """Content as one string (text parts joined), as chat templates expect."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template reads it: set keys, content as text."""
        return {**self.model_dump(exclude_none=True), "content": self.text() or ""}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: the schema the text must follow."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field("response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the grammar is enforced either way


class ResponseFormat(BaseModel):
    """OpenAI's response_format: free text, any JSON object, or a JSON Schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")
        return self


class SamplingRequest(BaseModel):
    """What chat and text completion requests share: the model, sampling,
    choices, stop conditions and streaming. `top_k`, `ignore_eos` and
    `stop_token_ids` are extensions (as in vLLM)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables top-k.")
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[NonNegativeInt] | None = Field(None, max_length=MAX_STOP_STRINGS)
    user: str | None = None
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(stop == "" for stop in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if not value:
            return None
        if len(value) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"logit_bias may list at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(value)}")
        for key, bias in value.items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias of token {key} must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias}")
        return value

    def logit_bias_pairs(self) -> list[tuple[int, float]]:
        """(token id, bias) pairs of logit_bias, in token order."""
        return sorted((int(key), bias) for key, bias in (self.logit_bias or {}).items())

    def output_grammar(self) -> dict[str, Any] | None:
        """The JSON Schema the generated text must follow ({"type": "object"}
        for any JSON object); None for free text."""
        response_format = self.response_format
        if response_format is None or response_format.type == "text":
            return None
        if response_format.json_schema is None or response_format.json_schema.json_schema is None:
            return {"type": "object"}
        return response_format.json_schema.json_schema

    def stop_strings(self) -> list[str]:
        assert self.stop is None or isinstance(self.stop, list)  # normalised by _check_stop
        return self.stop or []

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# One prompt of a text completion: text, or token ids.
Prompt = str | list[int]


class CompletionRequest(SamplingRequest):
    """POST /v1/completions body (OpenAI's legacy text completions): the prompt
    is continued as it is, without a chat template. `prompt` is a string, a
    list of strings, a list of token ids, or a list of such lists; choice
    `i * n + j` is the j-th choice of prompt i, as in OpenAI's API."""

    prompt: str | list[str] | list[NonNegativeInt] | list[list[NonNegativeInt]]
    # 0 only with echo: the prompt is scored and nothing generated.
    max_tokens: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: str | list) -> str | list:
        if isinstance(value, list) and not value:
            raise ValueError("the prompt list must not be empty")
        if isinstance(value, list) and any(isinstance(p, list) and not p for p in value):
            raise ValueError("a prompt of token ids must not be empty")
        return value

    @model_validator(mode="after")
    def _reject_unsupported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo (it scores the prompt and generates nothing)")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        choices = len(self.prompts()) * self.n
        if choices > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} choices per request (prompts x n), got {choices}")
        return self

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per generated token when logprobs were asked for, else None."""
        return self.logprobs

    def prompts(self) -> list[Prompt]:
        """The prompts as a list (one string, or one list of ids, is one prompt)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose K/V the dataplane's prefix cache held


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


FinishReasonText = Literal["stop", "length"]


class CompletionLogprobs(BaseModel):
    """A text completion choice's log-probabilities (the legacy shape):
    parallel lists, one entry per token (with echo, the prompt's tokens
    first); `text_offset` is where each token's text starts in the choice's
    text."""

    tokens: list[str]
    # None for a prompt's first token (with echo): nothing comes before it.
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    """A text completion's choice; in a streamed chunk `finish_reason` is None
    until the choice's last chunk."""

    index: int
    text: str
    finish_reason: FinishReasonText | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A text completion, and also each SSE event of a streamed one (OpenAI
    uses the same object for both; `usage` is None in content chunks)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TokenizeRequest(BaseModel):
    """POST /tokenize body (as vLLM's): a prompt, tokenized as /v1/completions
    does, or chat messages, rendered and tokenized as /v1/chat/completions
    does. `add_special_tokens` defaults to what that endpoint does."""

    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    tokens: list[NonNegativeInt]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagedweight"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
