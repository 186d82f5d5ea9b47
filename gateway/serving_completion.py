"""POST /v1/completions: OpenAI's text completions. The prompt (text or token
ids, one or several) is continued as it is, with the tokenizer's own special
tokens (e.g. BOS) and no chat template, which is what a base model expects.
`echo` puts the prompt's text before each choice's completion (with
`logprobs`, the prompt's tokens are scored too). Responses are
one JSON body or SSE chunks ending with `data: [DONE]`; the context-length
policy and the running of choices are shared with chat (gateway/generation.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.errors import invalid_request
from gateway.generation import (
    DEFAULT_COMPLETION_TOKENS,
    GenerationService,
    PreparedGeneration,
    PromptPlan,
    known_token_ids,
    plan_prompt,
)
from gateway.logprobs import completion_logprobs
from gateway.protocol import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    Prompt,
    Usage,
)
from gateway.sequence import SequenceDelta
from gateway.served_model import ServedModel


@dataclass(frozen=True)
class PreparedCompletion:
    generation: PreparedGeneration
    echo: bool
    # Text put before choice i's completion: its prompt with `echo`, else "".
    echoed: list[str]
    # max_tokens 0 with echo: only the prompt is answered. The dataplane
    # generates one token (its contract asks for >= 1), which is left out of
    # the text, the logprobs and the usage.
    score_only: bool = False


class CompletionService:
    """Prompt tokenization and response assembly of text completions; one per app."""

    def __init__(self, generation: GenerationService) -> None:
        self._generation = generation

    async def prepare(self, body: CompletionRequest) -> PreparedCompletion:
        """Validates `body` against the model and tokenizes the prompts."""
        arrival_s = time.monotonic()
        model = await self._generation.model_for(body.model)
        prompts = body.prompts()
        plans = []
        score_only = body.max_tokens == 0
        max_tokens = 1 if score_only else body.max_tokens
        for prompt in prompts:
            ids = self._prompt_ids(prompt, model)
            plans.append(
                plan_prompt(ids, max_tokens, DEFAULT_COMPLETION_TOKENS, model.context_length, "prompt", "max_tokens")
            )
        generation = self._generation.prepare(
            "cmpl", body, plans, model, arrival_s,
            detokenizer_context=True, top_logprobs=body.top_logprobs_wanted(), prompt_logprobs=body.echo,
        )
        echoed = [self._echo_text(prompt, plan, model) if body.echo else "" for prompt, plan in zip(prompts, plans)]
        return PreparedCompletion(
            generation, body.echo, [text for text in echoed for _ in range(body.n)], score_only
        )

    async def complete(
        self, completion: PreparedCompletion, disconnected: Callable[[], Awaitable[None]]
    ) -> Completion:
        """Non-streaming answer. Raises APIError, or ClientDisconnected."""
        prepared = completion.generation
        collected = await self._generation.collect(prepared, disconnected)
        choices = []
        for i, (text, reason) in enumerate(zip(collected.texts, collected.finish_reasons, strict=True)):
            generated = [] if completion.score_only else collected.logprobs[i]
            text, reason = ("", "length") if completion.score_only else (text, reason)
            logprobs = None
            if prepared.logprobs:
                # With echo the prompt's tokens come first, from offset 0.
                entries = collected.prompt_logprobs[i] + generated
                first = self._prompt_first_token(completion, i) if completion.echo else None
                logprobs, _ = completion_logprobs(entries, prepared.tokenizer, 0, first)
            choices.append(
                CompletionChoice(index=i, text=completion.echoed[i] + text, finish_reason=reason, logprobs=logprobs)
            )
        usage = self._generation.usage(prepared, collected.completion_tokens, collected.cached_prompt_tokens)
        usage = self._scored_usage(completion, usage)
        return Completion(id=prepared.id, created=prepared.created, model=prepared.model, choices=choices, usage=usage)

    def stream(
        self, completion: PreparedCompletion, disconnected: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[str]:
        """SSE events: with `echo` each choice's prompt text comes first, in a
        chunk of its own, or with logprobs on the choice's first chunk."""
        prepared = completion.generation

        def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
            return Completion(
                id=prepared.id, created=prepared.created, model=prepared.model, choices=choices, usage=usage
            )

        # Where each choice's next token text starts (logprobs' text_offset).
        offsets = [0] * len(completion.echoed)
        # With logprobs the echo rides on each choice's first chunk, beside the
        # prompt's logprobs (they come with the first generated token).
        echo_on_first_chunk = completion.echo and prepared.logprobs
        first_chunk = [True] * len(completion.echoed)

        def chunk_of(delta: SequenceDelta) -> Completion:
            index = delta.index
            echo_here = echo_on_first_chunk and first_chunk[index]
            first_chunk[index] = False
            new_text, generated, reason = delta.text, delta.logprobs, delta.finish_reason
            if completion.score_only:  # the one generated token is not part of the answer
                new_text, generated, reason = "", (), "length" if reason else None
            logprobs = None
            if prepared.logprobs:
                logprobs, offsets[index] = completion_logprobs(
                    delta.prompt_logprobs + tuple(generated),
                    prepared.tokenizer,
                    offsets[index],
                    self._prompt_first_token(completion, index) if echo_here else None,
                )
            text = (completion.echoed[index] if echo_here else "") + new_text
            choice = CompletionChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs)
            return chunk([choice])

        opening = [] if prepared.logprobs else [
            chunk([CompletionChoice(index=index, text=text)])
            for index, text in enumerate(completion.echoed)
            if text
        ]
        return self._generation.sse_events(
            prepared, disconnected, opening, chunk_of, lambda usage: chunk([], self._scored_usage(completion, usage))
        )

    @staticmethod
    def _scored_usage(completion: PreparedCompletion, usage: Usage) -> Usage:
        """The usage a client sees: no completion tokens when only the prompt was scored."""
        if not completion.score_only:
            return usage
        return usage.model_copy(update={"completion_tokens": 0, "total_tokens": usage.prompt_tokens})

    @staticmethod
    def _prompt_ids(prompt: Prompt, model: ServedModel) -> list[int]:
        """Token ids of one prompt; raises APIError 400 for ids the tokenizer
        does not know or a prompt that tokenizes to nothing."""
        if isinstance(prompt, str):
            ids = model.tokenizer.encode_prompt(prompt)
            if not ids:
                raise invalid_request("the prompt is empty and the tokenizer adds no tokens to it", param="prompt")
            return ids
        return known_token_ids(prompt, model.tokenizer, "prompt")

    @staticmethod
    def _prompt_first_token(completion: PreparedCompletion, index: int) -> int:
        """The first token of choice `index`'s prompt."""
        return completion.generation.sequences[index].request.prompt_token_ids[0]

    @staticmethod
    def _echo_text(prompt: Prompt, plan: PromptPlan, model: ServedModel) -> str:
        """The prompt as text: a text prompt verbatim, token ids decoded
        (special tokens the tokenizer added are not part of the text)."""
        return prompt if isinstance(prompt, str) else model.tokenizer.decode(plan.token_ids)
