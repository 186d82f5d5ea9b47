"""A sequence's dataplane responses as one stream, across a lost dataplane.

When the connection to the dataplane drops mid-request (the dataplane
crashed and is being restarted, launcher/supervisor.py), the gateway does not
fail the request: it waits for the dataplane to answer again and sends a
*continuation*, the original request with the tokens generated so far
appended to its prompt and that many fewer to generate. The client's stream
goes on where it stopped. Only transport loss (gRPC UNAVAILABLE) is resumed;
a request the dataplane rejected or aborted fails as before.

What a continuation cannot carry over: a sampled request draws from a fresh
random stream (seeded requests stay reproducible run to run, but not equal to
an uninterrupted run), and presence/frequency penalties count only the tokens
generated after the resumption (the dataplane applies them to generated
tokens; the earlier ones are prompt to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from gateway.dataplane_client import DataplaneClient, DataplaneError, DataplaneErrorKind
from pagedweight.v1 import inference_pb2

# Backoff between attempts to reach a dataplane that went away.
INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


@dataclass(frozen=True)
class ResumePolicy:
    """``outages``: how many times one sequence may lose the dataplane and go
    on (0: the first loss fails the request, 503); ``wait_s``: how long one
    outage may last before the request fails."""

    outages: int
    wait_s: float

    def __post_init__(self) -> None:
        if self.outages < 0 or self.wait_s <= 0:
            raise ValueError(f"need outages >= 0 and wait_s > 0, got {self.outages}, {self.wait_s}")


def continuation(request: inference_pb2.GenerateRequest, generated: list[int], resumed: int,
                 prompt_logprobs_received: bool) -> inference_pb2.GenerateRequest:
    """``request`` picked up after ``generated`` tokens: they join the prompt
    and the limit shrinks by as many; prompt logprobs already received are not
    asked for again. The id is new (the old one may linger at the dataplane)."""
    remaining = request.sampling.max_tokens - len(generated)
    if remaining < 1:
        raise DataplaneError(DataplaneErrorKind.INTERNAL, "the dataplane stream ended after its last token")
    resumed_request = inference_pb2.GenerateRequest()
    resumed_request.CopyFrom(request)
    resumed_request.request_id = f"{request.request_id}-resumed{resumed}"
    resumed_request.prompt_token_ids.extend(generated)
    resumed_request.sampling.max_tokens = remaining
    if prompt_logprobs_received:
        resumed_request.sampling.ClearField("prompt_logprobs")
    return resumed_request


async def resumable_responses(
    client: DataplaneClient,
    request: inference_pb2.GenerateRequest,
    timeout_s: float,
    policy: ResumePolicy,
    on_resume: Callable[[], None] | None = None,
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    """The responses to ``request`` as if one dataplane call produced them all:
    after a resumption ``completion_tokens`` still counts from the original
    request and ``cached_prompt_tokens`` stays the first call's. Ends after
    the response with a finish reason, or when a call ends without one (the
    caller reports that). Raises DataplaneError; ``on_resume`` is called once
    per outage survived."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    current = request
    generated: list[int] = []
    cached_prompt_tokens: int | None = None
    prompt_logprobs_received = False
    outages = 0
    outage_since: float | None = None
    backoff = INITIAL_BACKOFF_S
    while True:
        offset = len(generated)
        try:
            async with aclosing(client.generate(current, max(deadline - loop.time(), 0.0))) as stream:
                async for response in stream:
                    if outage_since is not None:
                        outage_since, backoff = None, INITIAL_BACKOFF_S
                        if on_resume is not None:
                            on_resume()
                    response.completion_tokens += offset
                    if cached_prompt_tokens is None:
                        cached_prompt_tokens = response.cached_prompt_tokens
                    response.cached_prompt_tokens = cached_prompt_tokens
                    prompt_logprobs_received = prompt_logprobs_received or bool(response.prompt_logprobs)
                    generated += response.token_ids
                    yield response
                    if response.finish_reason != inference_pb2.FINISH_REASON_UNSPECIFIED:
                        return
            return
        except DataplaneError as error:
            if error.kind is not DataplaneErrorKind.UNAVAILABLE:
                raise
            now = loop.time()
            if outage_since is None:  # a new outage
                if outages >= policy.outages:
                    raise
                outages += 1
                outage_since = now
            elif now - outage_since >= policy.wait_s:
                raise DataplaneError(
                    DataplaneErrorKind.UNAVAILABLE,
                    f"{error.message} (gone for {policy.wait_s:g} s while generating)",
                ) from error
            if now + backoff >= deadline:
                raise
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, MAX_BACKOFF_S)
            current = continuation(request, generated, outages, prompt_logprobs_received)
