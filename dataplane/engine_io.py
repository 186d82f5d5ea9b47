"""What the engine's callers send and receive (the in-process side of
inference.proto): request errors, per-step outputs, output sinks and the
engine's published stats snapshot."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from dataplane.logprobs import TokenLogprobs
from dataplane.memory.arena import ArenaSnapshot
from dataplane.sequence import FinishReason


class InvalidRequest(ValueError):
    """The request breaks the contract (empty prompt, bad ids or sampling...)."""


class QueueFull(RuntimeError):
    """The engine holds max_pending_requests unfinished requests already."""


@dataclass(frozen=True)
class RequestOutput:
    """Tokens of one request produced by one step (or its end)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None  # set on the request's last output
    prompt_tokens: int
    completion_tokens: int  # generated so far, including new_token_ids
    # Parallel to new_token_ids when the request asked for logprobs, else empty.
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # Prompt tokens 1.. when the request asked for prompt_logprobs: on the
    # request's first output with tokens only, else empty.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)


OutputSink = Callable[[RequestOutput], None]


class QueueSink:
    """A per-request output queue for in-process callers (tests, tools)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[RequestOutput] = queue.Queue()

    def __call__(self, output: RequestOutput) -> None:
        self.queue.put(output)

    def outputs(self, timeout: float | None = None) -> Iterator[RequestOutput]:
        """Yields outputs until the final one (finish_reason set)."""
        while True:
            out = self.queue.get(timeout=timeout)
            yield out
            if out.finish_reason is not None:
                return


@dataclass(frozen=True)
class EngineStats:
    """A consistent snapshot of the engine (see inference.proto EngineStats)."""

    running_requests: int = 0
    waiting_requests: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    kv_block_size: int = 0
    generated_tokens_total: int = 0
    prompt_tokens_total: int = 0
    preemptions_total: int = 0
    finished_requests_total: int = 0
    aborted_requests_total: int = 0
    steps_total: int = 0
    arena: ArenaSnapshot | None = None
    fixed_resident_bytes: int = 0
