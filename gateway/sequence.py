"""One generated sequence (one OpenAI "choice"): token stream in, text out.

Runs one dataplane Generate call, detokenizes incrementally, applies stop
strings (cancelling the dataplane request when one matches), and records the
per-token metrics.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from gateway.dataplane_client import DataplaneClient, DataplaneError, DataplaneErrorKind
from gateway.detokenizer import IncrementalDetokenizer, StopStringMatcher
from gateway.metrics import GatewayMetrics
from gateway.resume import ResumePolicy, resumable_responses
from gateway.tokenizer import TextTokenizer
from pagedweight.v1 import inference_pb2

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
# Metric labels of sequences that did not finish normally.
FINISH_CANCELLED = "cancelled"
FINISH_ERROR = "error"

_FINISH_TEXT = {
    inference_pb2.FINISH_REASON_STOP: FINISH_STOP,
    inference_pb2.FINISH_REASON_LENGTH: FINISH_LENGTH,
}


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely alternatives
    at its position ((token id, log-probability), most likely first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SequenceDelta:
    """New text of choice `index`; the last delta of a choice has
    `finish_reason` set ("stop" or "length"). `completion_tokens` counts every
    token the dataplane generated so far (stop tokens included). `logprobs`:
    when the request asked for them, one entry per token received since the
    previous delta (a final stop token, which is not text, has none); text
    held back (an incomplete character, a possible stop string) comes in a
    later delta than its tokens' entries."""

    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    # The prompt's tokens from the second on, when the request asked for
    # prompt logprobs: on the choice's first delta only.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    # Prompt tokens the dataplane took from its prefix cache.
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class SequenceSpec:
    index: int
    request: inference_pb2.GenerateRequest
    stop_strings: Sequence[str]
    # Token ids that end generation (eos unless ignored, plus requested ones):
    # a final stop token is not part of the text.
    stop_token_ids: frozenset[int]
    # Tokens already in the text before the first generated one (a text
    # completion's prompt tail): they prime the detokenizer and are not emitted.
    context_token_ids: tuple[int, ...] = ()


async def generate_sequence(
    spec: SequenceSpec,
    client: DataplaneClient,
    tokenizer: TextTokenizer,
    metrics: GatewayMetrics,
    arrival_s: float,
    timeout_s: float,
    resume: ResumePolicy,
) -> AsyncIterator[SequenceDelta]:
    """Yields deltas with non-empty text, then one final delta with a finish
    reason. Closing the iterator early aborts the dataplane request. A
    dataplane lost mid-request is waited for and the sequence continued
    (gateway/resume.py, under `resume`). Raises DataplaneError; a
    dataplane-side abort is reported as UNAVAILABLE.
    `arrival_s` is the request's time.monotonic() arrival (for TTFT)."""
    outcome = FINISH_CANCELLED
    try:
        # aclosing: when our consumer stops early, the inner stream (and with
        # it the gRPC call) is closed now, not whenever it is collected.
        async with aclosing(_generate(spec, client, tokenizer, metrics, arrival_s, timeout_s, resume)) as deltas:
            async for delta in deltas:
                if delta.finish_reason is not None:
                    outcome = delta.finish_reason
                yield delta
    except DataplaneError:
        outcome = FINISH_ERROR
        raise
    finally:
        metrics.sequences_finished.labels(finish_reason=outcome).inc()


async def _generate(
    spec: SequenceSpec,
    client: DataplaneClient,
    tokenizer: TextTokenizer,
    metrics: GatewayMetrics,
    arrival_s: float,
    timeout_s: float,
    resume: ResumePolicy,
) -> AsyncIterator[SequenceDelta]:
    detokenizer = IncrementalDetokenizer(tokenizer, spec.context_token_ids)
    matcher = StopStringMatcher(spec.stop_strings)
    completion_tokens = 0
    last_token_s: float | None = None
    logprobs: list[TokenLogprob] = []  # entries not yet sent with a delta
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # not yet sent with a delta
    prompt = spec.request.prompt_token_ids
    responses = resumable_responses(client, spec.request, timeout_s, resume, metrics.sequences_resumed.inc)
    async with aclosing(responses) as stream:
        async for response in stream:
            token_ids = list(response.token_ids)
            cached = response.cached_prompt_tokens
            if response.logprobs:
                if len(response.logprobs) != len(token_ids):
                    raise DataplaneError(
                        DataplaneErrorKind.INTERNAL, "the dataplane sent logprobs that do not match its tokens"
                    )
                logprobs += [_token_logprob(token, entry) for token, entry in zip(token_ids, response.logprobs)]
            if response.prompt_logprobs:
                if len(response.prompt_logprobs) != len(prompt) - 1:
                    raise DataplaneError(
                        DataplaneErrorKind.INTERNAL, "the dataplane sent prompt logprobs that do not match the prompt"
                    )
                prompt_logprobs = tuple(
                    _token_logprob(token, entry) for token, entry in zip(prompt[1:], response.prompt_logprobs)
                )
            if token_ids:
                now = time.monotonic()
                if last_token_s is None:
                    metrics.time_to_first_token.observe(now - arrival_s)
                else:
                    gap = (now - last_token_s) / len(token_ids)
                    for _ in token_ids:
                        metrics.inter_token_latency.observe(gap)
                last_token_s = now
                metrics.generation_tokens.inc(len(token_ids))
            completion_tokens = max(response.completion_tokens, completion_tokens + len(token_ids))
            reason = response.finish_reason
            if reason == inference_pb2.FINISH_REASON_ABORT:
                raise DataplaneError(DataplaneErrorKind.UNAVAILABLE, "the dataplane aborted the request")
            finished = reason != inference_pb2.FINISH_REASON_UNSPECIFIED
            if finished and reason == inference_pb2.FINISH_REASON_STOP and token_ids:
                if token_ids[-1] in spec.stop_token_ids:
                    token_ids.pop()
                    if response.logprobs:
                        logprobs.pop()
            text = detokenizer.push(token_ids)
            if finished:
                text += detokenizer.flush()
            emitted, matched = matcher.push(text)
            if matched:
                # Leaving the `async with` closes the stream: the call is cancelled.
                yield SequenceDelta(
                    spec.index, emitted, FINISH_STOP, completion_tokens, tuple(logprobs), prompt_logprobs, cached
                )
                return
            if finished:
                emitted += matcher.flush()
                yield SequenceDelta(
                    spec.index, emitted, _FINISH_TEXT[reason], completion_tokens, tuple(logprobs), prompt_logprobs, cached
                )
                return
            if emitted:
                yield SequenceDelta(spec.index, emitted, None, completion_tokens, tuple(logprobs), prompt_logprobs, cached)
                logprobs, prompt_logprobs = [], ()
    raise DataplaneError(DataplaneErrorKind.INTERNAL, "the dataplane ended the stream without a finish reason")


def _token_logprob(token_id: int, entry: inference_pb2.TokenLogprobs) -> TokenLogprob:
    return TokenLogprob(token_id, entry.logprob, tuple(zip(entry.top_token_ids, entry.top_logprobs)))
