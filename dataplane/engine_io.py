"""What the engine's callers send and receive (the in-process side of
inference.proto): request validation and errors, per-step outputs, output
sinks and the engine's published stats snapshot."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from dataplane.kv_cache import KVCacheManager, blocks_for_tokens
from dataplane.logprobs import TokenLogprobs
from dataplane.memory.arena import Arena, ArenaSnapshot
from dataplane.model_info import ModelInfo
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler import Scheduler
from dataplane.sequence import FinishReason, Sequence


class InvalidRequest(ValueError):
    """The request breaks the contract (empty prompt, bad ids or sampling...)."""


def validate_request(
    request_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    info: ModelInfo,
    kv_block_size: int,
    arena_pages: int,
) -> None:
    """Raises InvalidRequest when a request breaks the contract for this
    model and memory pool (its prompt's KV blocks must fit the pool alone)."""
    if not request_id:
        raise InvalidRequest("request_id must not be empty")
    if not prompt:
        raise InvalidRequest("prompt_token_ids must not be empty")
    if len(prompt) >= info.context_length:
        raise InvalidRequest(f"prompt has {len(prompt)} tokens; the context length is {info.context_length}")
    bad = [t for t in prompt if not 0 <= t < info.vocab_size]
    if bad:
        raise InvalidRequest(f"prompt token ids outside the vocabulary (size {info.vocab_size}): {bad[:5]}")
    needed = blocks_for_tokens(len(prompt) + 1, kv_block_size)
    if needed > arena_pages:
        raise InvalidRequest(f"prompt needs {needed} KV blocks; the memory pool has {arena_pages}")
    try:
        sampling.validate(info.vocab_size)
    except ValueError as err:
        raise InvalidRequest(str(err)) from err


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
    # Prompt tokens whose K/V came from the prefix cache.
    cached_prompt_tokens: int = 0


OutputSink = Callable[[RequestOutput], None]


def request_output(
    seq: Sequence, tokens: list[int], reason: FinishReason | None, logprobs: list[TokenLogprobs] | None = None
) -> RequestOutput:
    """The output of ``seq``'s ``tokens`` (just generated; may be none at its
    end); its prompt's logprobs go with the first output that has tokens."""
    prompt_logprobs = seq.take_prompt_logprobs() if tokens else []
    return RequestOutput(
        seq.seq_id, tokens, reason, seq.num_prompt_tokens, len(seq.output_token_ids), logprobs or [],
        prompt_logprobs, seq.num_cached_prompt_tokens,
    )


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
    prefix_cached_tokens_total: int = 0
    kernel_compiles_total: int = 0
    arena: ArenaSnapshot | None = None
    fixed_resident_bytes: int = 0


@dataclass
class EngineCounters:
    """The engine thread's running totals (published in EngineStats)."""

    generated_tokens: int = 0
    prompt_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    kernel_compiles: int = 0


def engine_stats(
    counters: EngineCounters, scheduler: Scheduler, kv: KVCacheManager, arena: Arena, fixed_resident_bytes: int
) -> EngineStats:
    """The snapshot of the engine's state now (engine thread only)."""
    return EngineStats(
        running_requests=len(scheduler.running),
        waiting_requests=len(scheduler.waiting),
        kv_blocks_used=kv.used_blocks,
        kv_blocks_free=kv.free_blocks,
        kv_block_size=kv.block_size,
        generated_tokens_total=counters.generated_tokens,
        prompt_tokens_total=counters.prompt_tokens,
        preemptions_total=scheduler.preemptions_total,
        finished_requests_total=counters.finished,
        aborted_requests_total=counters.aborted,
        steps_total=counters.steps,
        prefix_cached_tokens_total=scheduler.cached_tokens_total,
        kernel_compiles_total=counters.kernel_compiles,
        arena=arena.snapshot(),
        fixed_resident_bytes=fixed_resident_bytes,
    )
