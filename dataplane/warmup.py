"""Start-up warm-up: the first traffic's one-time costs, paid before serving.

A fresh dataplane compiles a Triton kernel variant the first time a step
reaches a new token-tile class (kernels/moe_tile_choice.py ``choose_tiles`` picks
tiles from the tokens per expert; other constexprs follow powers of two of
the token count) and captures a decode CUDA graph the first time a batch
bucket is used (dataplane/cuda_graphs.py). On an empty Triton cache the
warm-up's first prefill rounds (16-256 tokens) took 18-55 s each at
Mixtral-8x7B shapes on the H100
(benchmarks/results/memory_pressure_planned_skip_ahead_h100_s44.json), a
cost that would otherwise fall on whichever requests come first; with this
warm-up the first 4,096-token
prefill of a burst took 565 ms instead of 1,440 ms
(benchmarks/results/memory_pressure_warmup_h100_s42.json).

The rounds cover every variant a step can need because the launches whose
integer arguments follow the step's token count or block-table width do not
specialize them (Triton marks an int equal to 1 or divisible by 16): the MoE
prep and entry launches (``T``) and the decode attention (``max_blocks``,
its split count a power of two of the batch size). Before that, the first
mixed step of a burst (63 decodes + 218 prompt tokens) compiled a prep
variant of its own and took 2.7 s, warm-up or not (benchmarks/NOTES.md,
session 43).

``warm_up`` sends synthetic requests through the engine's own path (so every
code path a real request takes is compiled and captured, nothing is
special-cased) and then zeroes the engine's counters and routing window, so
neither the metrics nor the controlplane's activity table see the synthetic
traffic. The rounds (``warmup_rounds``):

* one prefill per token count 1, 2, 4, ... up to the step's token budget
  (each a step of its own; until session 54 the counts under one KV block
  were covered only by the host-only rounds, now gone);
* for each decode batch bucket B, B short requests decoding together (the
  bucket's graph is captured on its first decode step);
* a burst of ``max_running_seqs`` requests whose prompts take several steps,
  so prefill chunks run beside decodes (the mixed steps).

A host-only expert block needs no rounds of its own: the MoE kernels read it
in place from the host through the page table, in the same launches and
graphs as resident blocks (dataplane/weights/store.py).

Contract: the engine is started and idle, and nothing else submits requests
until ``warm_up`` returns (the server is not yet serving).
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

import numpy as np

from dataplane.cuda_graphs import batch_buckets
from dataplane.engine import Engine
from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams
from dataplane.sequence import FinishReason

log = logging.getLogger(__name__)

# Decode steps per request in the bucket rounds: the first decode captures the
# bucket's graph, the second replays it (and, with overlap_steps, is launched
# ahead), so both the capture and the replay path have run.
BUCKET_DECODE_TOKENS = 3
# Tokens per request in the mixed round: enough decodes for the last prompts'
# prefill chunks to run beside the first requests' decodes.
MIXED_DECODE_TOKENS = 4
# The mixed round's prompts together fill this many steps' token budgets.
MIXED_PREFILL_STEPS = 2
# A round fills at most 1 / KV_SHARE_DIVISOR of the free KV blocks.
KV_SHARE_DIVISOR = 2
WARMUP_SEED = 0
REQUEST_PREFIX = "warmup-"


@dataclass(frozen=True)
class WarmupRound:
    """Requests submitted together: one per prompt length, each generating
    ``max_tokens`` tokens (EOS ignored)."""

    prompt_lengths: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class WarmupReport:
    seconds: float
    rounds: int
    requests: int
    steps: int  # engine steps the warm-up took
    round_seconds: tuple[float, ...]  # wall time of each round, in order


def warmup_rounds(
    *,
    buckets: tuple[int, ...],
    max_running_seqs: int,
    max_batched_tokens: int,
    max_pending_requests: int,
    block_size: int,
    context_length: int,
    kv_tokens: int,
) -> list[WarmupRound]:
    """The rounds described in the module docstring.

    ``kv_tokens``: the KV room (in tokens) one round may fill (the engine
    passes half its free blocks: the precision ladder stays still where the
    other half is above the low watermark); prompts are clamped to it and to
    the context length. Batches are clamped to ``max_pending_requests``.
    """
    if min(max_running_seqs, max_batched_tokens, max_pending_requests, block_size, kv_tokens) < 1:
        raise ValueError("warm-up limits must all be >= 1")
    longest = max(1, min(context_length - 1 - MIXED_DECODE_TOKENS, kv_tokens))
    rounds = [WarmupRound((min(n, longest),), 1) for n in _doubling(1, max_batched_tokens)]
    short = min(block_size, longest)
    for bucket in buckets:
        batch = min(bucket, max_running_seqs, max_pending_requests)
        rounds.append(WarmupRound((short,) * batch, BUCKET_DECODE_TOKENS))
    burst = min(max_running_seqs, max_pending_requests)
    mixed = max(block_size, MIXED_PREFILL_STEPS * max_batched_tokens // burst)
    mixed = max(1, min(mixed, longest, kv_tokens // burst - MIXED_DECODE_TOKENS))
    rounds.append(WarmupRound((mixed,) * burst, MIXED_DECODE_TOKENS))
    # Equal rounds (small limits clamp many to one) would only repeat work.
    return list(dict.fromkeys(rounds))


def _doubling(first: int, limit: int) -> list[int]:
    """first, 2 * first, 4 * first, ... below limit, then limit."""
    out = []
    while first < limit:
        out.append(first)
        first *= 2
    return out + [limit]


def engine_warmup_rounds(engine: Engine) -> list[WarmupRound]:
    """``warmup_rounds`` for this engine: its decode graphs' buckets (or the
    default buckets when it runs eagerly), its scheduler's limits, and half of
    its free KV blocks."""
    sched = engine.scheduler.config
    graphs = engine.runner.graphs
    return warmup_rounds(
        buckets=graphs.buckets if graphs is not None else batch_buckets(sched.max_running_seqs),
        max_running_seqs=sched.max_running_seqs,
        max_batched_tokens=sched.max_batched_tokens,
        max_pending_requests=engine.max_pending_requests,
        block_size=engine.kv.block_size,
        context_length=engine.model_info.context_length,
        kv_tokens=engine.kv.free_blocks * engine.kv.block_size // KV_SHARE_DIVISOR,
    )


def warm_up(engine: Engine, rounds: list[WarmupRound], round_timeout_s: float) -> WarmupReport:
    """Runs ``rounds`` one after another through ``engine``, then zeroes its
    counters and routing window (``Engine.reset_counters``).

    Raises RuntimeError when a warm-up request ends in an abort or the engine
    dies, TimeoutError when a round's output takes over ``round_timeout_s``.
    """
    start = time.perf_counter()
    steps_before = engine.stats().steps_total
    requests, round_seconds = _run_rounds(engine, rounds, round_timeout_s)
    steps = engine.stats().steps_total - steps_before
    engine.reset_counters()
    return WarmupReport(time.perf_counter() - start, len(rounds), requests, steps, tuple(round_seconds))


def _run_rounds(engine: Engine, rounds: list[WarmupRound], round_timeout_s: float) -> tuple[int, list[float]]:
    """warm_up's rounds; returns the requests sent and each round's seconds."""
    rng = np.random.default_rng(WARMUP_SEED)
    vocab = engine.model_info.vocab_size
    requests, round_seconds = 0, []
    for r, warm_round in enumerate(rounds):
        round_start = time.perf_counter()
        sampling = SamplingParams(max_tokens=warm_round.max_tokens, ignore_eos=True)
        # Random prompts: distinct, so the prefix cache never shortens a prefill.
        prompts = [rng.integers(0, vocab, size=length).tolist() for length in warm_round.prompt_lengths]
        sinks = [QueueSink() for _ in prompts]
        # Added from the engine thread, a round's requests reach its scheduler
        # together: added from here, the engine could wake between two of them
        # and schedule the first alone, and a bucket round would then never
        # decode its whole batch in one step (nor capture that bucket's graph).
        engine.run_on_engine_thread(lambda: _add_requests(engine, f"{REQUEST_PREFIX}{r}-", prompts, sampling, sinks))
        requests += len(sinks)
        for sink in sinks:
            try:
                last = list(sink.outputs(timeout=round_timeout_s))[-1]
            except queue.Empty as err:  # the engine is stuck or dead
                raise TimeoutError(f"warm-up round {r} got no output in {round_timeout_s} s "
                                   f"(engine error: {engine.error!r})") from err
            if last.finish_reason == FinishReason.ABORT:
                raise RuntimeError(f"warm-up request {last.request_id} was aborted (engine error: {engine.error!r})")
        round_seconds.append(time.perf_counter() - round_start)
        log.info("warm-up round %d/%d: %d requests, prompts of %d tokens, %.2f s", r + 1, len(rounds),
                 len(sinks), max(warm_round.prompt_lengths), round_seconds[-1])
    return requests, round_seconds


def _add_requests(engine: Engine, prefix: str, prompts: list[list[int]], sampling: SamplingParams,
                  sinks: list[QueueSink]) -> None:
    for i, (prompt, sink) in enumerate(zip(prompts, sinks)):
        engine.add_request(f"{prefix}{i}", prompt, sampling, sink)
