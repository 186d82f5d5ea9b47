"""What chat and text completions share: the served model (fetched once),
the context-length policy, the dataplane sequences of a request, and the two
ways of consuming them (collected into one answer, or as SSE events).

Context-length policy (documented choice, same as OpenAI and vLLM): a prompt
of context_length tokens or more is rejected; an explicit max_tokens with
prompt + max_tokens > context_length is rejected (400,
code "context_length_exceeded") rather than silently clamped, so the client
learns the real limit. Without max_tokens, a chat completion may use the whole
remaining context and a text completion at most `DEFAULT_COMPLETION_TOKENS`
(OpenAI's default for /v1/completions), never more than the context left.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from pydantic import BaseModel

from gateway.dataplane_client import DataplaneClient, DataplaneError
from gateway.errors import context_length_exceeded, dataplane_api_error, internal, invalid_request, model_not_found
from gateway.fanout import ClientDisconnected, merge_streams
from gateway.metrics import GatewayMetrics
from gateway.protocol import PromptTokensDetails, SamplingRequest, Usage
from gateway.resume import ResumePolicy
from gateway.sequence import SequenceDelta, SequenceSpec, TokenLogprob, generate_sequence
from gateway.served_model import ServedModel
from gateway.tokenizer import TextTokenizer
from pagedweight.v1 import inference_pb2

SSE_DONE = "data: [DONE]\n\n"
# OpenAI's max_tokens default for text completions.
DEFAULT_COMPLETION_TOKENS = 16
# Prompt tokens before the completion that the detokenizer sees, so the first
# generated token decodes with its neighbour (e.g. SentencePiece's leading
# space); a handful covers every known tokenizer (vLLM uses 5).
DETOKENIZER_CONTEXT_TOKENS = 5


@dataclass(frozen=True)
class PromptPlan:
    """One tokenized prompt and the completion budget it was given."""

    token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class PreparedGeneration:
    """A validated request, ready to generate: one dataplane sequence per choice."""

    id: str
    created: int
    model: str
    prompt_tokens: int  # all prompts, each counted once however many choices it has
    sequences: list[SequenceSpec]  # choice i * choices_per_prompt + j: prompt i's j-th
    choices_per_prompt: int
    include_usage: bool
    arrival_s: float  # time.monotonic()
    deadline_s: float  # time.monotonic() by which generation must end
    tokenizer: TextTokenizer  # the served model's: detokenizing, logprobs' token texts

    @property
    def logprobs(self) -> bool:
        """The choices report their tokens' log-probabilities."""
        return self.sequences[0].request.sampling.HasField("logprobs")


@dataclass(frozen=True)
class CollectedChoices:
    """The whole text of every choice, by index, and its tokens' logprobs
    (empty lists unless the request asked for them)."""

    texts: list[str]
    finish_reasons: list[str]
    completion_tokens: list[int]
    logprobs: list[list[TokenLogprob]]
    prompt_logprobs: list[list[TokenLogprob]]  # from the prompt's second token; empty unless asked
    cached_prompt_tokens: list[int]  # by choice: its prompt's tokens the prefix cache held


def plan_prompt(
    token_ids: list[int],
    requested_max_tokens: int | None,
    default_max_tokens: int | None,
    context: int,
    prompt_param: str,
    max_tokens_param: str,
) -> PromptPlan:
    """Applies the context-length policy to one prompt. `default_max_tokens`
    None means "the rest of the context"; the params name the request fields
    an error points at ("messages" / "prompt", "max_tokens" / ...). Raises
    APIError 400."""
    if len(token_ids) >= context:
        raise context_length_exceeded(
            f"This model's maximum context length is {context} tokens. However, your {prompt_param} resulted "
            f"in {len(token_ids)} tokens. Please reduce the length of the {prompt_param}.",
            param=prompt_param,
        )
    left = context - len(token_ids)
    if requested_max_tokens is None:
        return PromptPlan(token_ids, left if default_max_tokens is None else min(default_max_tokens, left))
    if requested_max_tokens > left:
        raise context_length_exceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(token_ids) + requested_max_tokens} tokens ({len(token_ids)} in the {prompt_param}, "
            f"{requested_max_tokens} in the completion). Please reduce the length of the {prompt_param} or "
            "completion.",
            param=max_tokens_param,
        )
    return PromptPlan(token_ids, requested_max_tokens)


def known_token_ids(ids: Sequence[int], tokenizer: TextTokenizer, param: str) -> list[int]:
    """`ids` as a list; raises APIError 400 naming `param` when the tokenizer
    does not know some of them."""
    vocab = tokenizer.vocab_size
    unknown = sorted({token for token in ids if token >= vocab})
    if unknown:
        raise invalid_request(
            f"token ids outside the tokenizer's vocabulary (size {vocab}): {unknown[:5]}", param=param
        )
    return list(ids)


def _set_structured_output(sampling: inference_pb2.SamplingParams, body: SamplingRequest) -> None:
    """The request's grammar (response_format, a forced tool call) for the
    dataplane; nothing for free text."""
    schema = body.output_grammar()
    if schema == {"type": "object"}:
        sampling.structured_output.json_object = True
    elif schema is not None:
        sampling.structured_output.json_schema = json.dumps(schema)


def _build_sequences(
    request_id: str,
    body: SamplingRequest,
    prompts: Sequence[PromptPlan],
    model: ServedModel,
    detokenizer_context: bool,
    top_logprobs: int | None,
    prompt_logprobs: bool = False,
) -> list[SequenceSpec]:
    """One dataplane request per choice: choice `i * n + j` is the j-th choice
    of prompt i and uses seed + j when a seed is given. With
    `detokenizer_context` the prompt's last tokens prime the detokenizer (a
    text completion continues the prompt's text). `top_logprobs` not None:
    every token comes with its log-probability and that many alternatives;
    with `prompt_logprobs` the prompt's tokens too."""
    stop_ids = frozenset(body.stop_token_ids or ()) | (frozenset() if body.ignore_eos else model.eos_token_ids)
    # What every choice shares; each copy gets its prompt's limit and its seed.
    shared = inference_pb2.SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        stop_token_ids=list(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=dict(body.logit_bias_pairs()),
    )
    _set_structured_output(shared, body)
    if top_logprobs is not None:
        shared.logprobs = top_logprobs
        if prompt_logprobs:
            shared.prompt_logprobs = top_logprobs
    sequences = []
    for prompt_index, prompt in enumerate(prompts):
        context_ids = tuple(prompt.token_ids[-DETOKENIZER_CONTEXT_TOKENS:]) if detokenizer_context else ()
        for choice in range(body.n):
            index = prompt_index * body.n + choice
            sampling = inference_pb2.SamplingParams()
            sampling.CopyFrom(shared)
            sampling.max_tokens = prompt.max_tokens
            if body.seed is not None:
                sampling.seed = body.seed + choice
            request = inference_pb2.GenerateRequest(
                request_id=f"{request_id}-{index}", prompt_token_ids=prompt.token_ids, sampling=sampling
            )
            sequences.append(SequenceSpec(index, request, body.stop_strings(), stop_ids, context_ids))
    return sequences


class GenerationService:
    """The served model and the running of prepared requests; one per app,
    shared by the chat and text completion services."""

    def __init__(
        self,
        client: DataplaneClient,
        metrics: GatewayMetrics,
        request_timeout_s: float,
        model_name_override: str | None,
        resume: ResumePolicy,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self.request_timeout_s = request_timeout_s
        self._resume = resume
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

    def prepare(
        self,
        id_prefix: str,
        body: SamplingRequest,
        prompts: Sequence[PromptPlan],
        model: ServedModel,
        arrival_s: float,
        *,
        detokenizer_context: bool,
        top_logprobs: int | None,
        prompt_logprobs: bool = False,
    ) -> PreparedGeneration:
        """The request ready to generate (see _build_sequences for the
        keyword arguments); its deadline is the request timeout after
        `arrival_s` (time.monotonic())."""
        known_token_ids([token for token, _ in body.logit_bias_pairs()], model.tokenizer, "logit_bias")
        request_id = f"{id_prefix}-{uuid.uuid4().hex}"
        sequences = _build_sequences(
            request_id, body, prompts, model, detokenizer_context, top_logprobs, prompt_logprobs
        )
        return PreparedGeneration(
            id=request_id,
            created=int(time.time()),
            model=model.name,
            prompt_tokens=sum(len(prompt.token_ids) for prompt in prompts),
            sequences=sequences,
            choices_per_prompt=body.n,
            include_usage=body.include_usage(),
            arrival_s=arrival_s,
            deadline_s=arrival_s + self.request_timeout_s,
            tokenizer=model.tokenizer,
        )

    async def model_for(self, requested: str) -> ServedModel:
        """The served model when `requested` names it, else APIError 404."""
        model = await self.served_model()
        if requested != model.name:
            raise model_not_found(requested)
        return model

    async def collect(
        self, prepared: PreparedGeneration, disconnected: Callable[[], Awaitable[None]]
    ) -> CollectedChoices:
        """Runs every choice to its end. Raises APIError, or ClientDisconnected
        (all dataplane requests are cancelled before it propagates)."""
        n = len(prepared.sequences)
        texts: list[list[str]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        tokens = [0] * n
        cached = [0] * n
        logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        prompt_logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        try:
            async with aclosing(self._deltas(prepared, disconnected)) as deltas:
                async for delta in deltas:
                    texts[delta.index].append(delta.text)
                    tokens[delta.index] = delta.completion_tokens
                    cached[delta.index] = delta.cached_prompt_tokens
                    reasons[delta.index] = delta.finish_reason or reasons[delta.index]
                    logprobs[delta.index] += delta.logprobs
                    prompt_logprobs[delta.index] += delta.prompt_logprobs
        except DataplaneError as error:
            raise dataplane_api_error(error) from error
        finally:
            self._metrics.request_latency.observe(time.monotonic() - prepared.arrival_s)
        texts_joined = ["".join(t) for t in texts]
        return CollectedChoices(
            texts_joined, [r or "stop" for r in reasons], tokens, logprobs, prompt_logprobs, cached
        )

    async def sse_events(
        self,
        prepared: PreparedGeneration,
        disconnected: Callable[[], Awaitable[None]],
        opening: Sequence[BaseModel],
        chunk_of: Callable[[SequenceDelta], BaseModel],
        usage_chunk: Callable[[Usage], BaseModel],
    ) -> AsyncIterator[str]:
        """SSE events: the `opening` chunks, one chunk per delta, the usage
        chunk when asked for, then [DONE]. A dataplane error after the 200
        header is sent as an `error` event followed by [DONE]; a disconnect
        ends the stream quietly. Like OpenAI, chunks carry "usage": null only
        when usage was asked for."""
        exclude = None if prepared.include_usage else {"usage"}
        tokens = [0] * len(prepared.sequences)
        cached = [0] * len(prepared.sequences)
        try:
            for chunk in opening:
                yield f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"
            async with aclosing(self._deltas(prepared, disconnected)) as deltas:
                async for delta in deltas:
                    tokens[delta.index] = delta.completion_tokens
                    cached[delta.index] = delta.cached_prompt_tokens
                    yield f"data: {chunk_of(delta).model_dump_json(exclude=exclude)}\n\n"
        except ClientDisconnected:
            return  # nobody is listening; the dataplane requests are cancelled
        except DataplaneError as error:
            yield f"data: {dataplane_api_error(error).body().model_dump_json()}\n\n"
            yield SSE_DONE
            return
        finally:
            self._metrics.request_latency.observe(time.monotonic() - prepared.arrival_s)
        if prepared.include_usage:
            yield f"data: {usage_chunk(self.usage(prepared, tokens, cached)).model_dump_json()}\n\n"
        yield SSE_DONE

    @staticmethod
    def usage(prepared: PreparedGeneration, completion_tokens: list[int], cached_prompt_tokens: list[int]) -> Usage:
        """Token counts by choice summed; OpenAI counts each prompt once however
        many choices were generated (its cached tokens: as its first choice saw them)."""
        total = sum(completion_tokens)
        return Usage(
            prompt_tokens=prepared.prompt_tokens,
            completion_tokens=total,
            total_tokens=prepared.prompt_tokens + total,
            prompt_tokens_details=PromptTokensDetails(
                cached_tokens=sum(cached_prompt_tokens[:: prepared.choices_per_prompt])
            ),
        )

    def _deltas(
        self, prepared: PreparedGeneration, disconnected: Callable[[], Awaitable[None]]
    ) -> AsyncGenerator[SequenceDelta, None]:
        self._metrics.prompt_tokens.inc(prepared.prompt_tokens)
        timeout_s = max(prepared.deadline_s - time.monotonic(), 0.0)
        streams = [
            generate_sequence(
                spec, self._client, prepared.tokenizer, self._metrics, prepared.arrival_s, timeout_s, self._resume
            )
            for spec in prepared.sequences
        ]
        return merge_streams(streams, disconnected)
