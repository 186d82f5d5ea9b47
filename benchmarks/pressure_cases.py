"""One case of benchmarks/memory_pressure.py, run in its own process: build
the engine in the given arena, warm it up, send the burst, trace every engine
iteration, and (for the dynamic cases) follow the burst with a trickle.

Cases (``CASES``):
* ``static-8`` / ``static-4``: experts fixed at 8 / 4 bits;
* ``dynamic``: the dataplane's precision controller with no controlplane, so
  it walks its local fallback order (least recently used blocks first, one
  view at a time);
* ``planned``: the same controller following the ladders of a real
  controlplane (``python -m controlplane`` in its own process on a free port,
  as served, its SQLite file in a temporary folder, telemetry over gRPC):
  demotions by predicted quality cost per byte from the model's sensitivity
  table and the routing it reports;
* ``planned-inline``: ``planned`` with the controlplane's server in the
  engine's process (``ControlplaneServer``), as this benchmark ran it up to
  session 40: its planning and telemetry handling share the engine's GIL,
  which ``planned`` does not (the cost of that sharing is the difference);
* ``planned-floor``: ``planned`` with the planner's default floor at
  ``--floor-bits`` (no block below it; past it the scheduler preempts), the
  operator's bound on how far a burst may take the quality down.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.pressure_controlplane import controlplane_inline, controlplane_process
from benchmarks.pressure_trace import StepTrace, trace_steps
from controlplane.config import PlannerConfig
from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build
from dataplane.engine_io import QueueSink
from dataplane.profiling.corpus import split_windows
from dataplane.sampling_params import SamplingParams

CASES = {
    "static-8": dict(dynamic_precision=False, initial_expert_bits=8),
    "static-4": dict(dynamic_precision=False, initial_expert_bits=4),
    "dynamic": dict(dynamic_precision=True, initial_expert_bits=8),
    "planned": dict(dynamic_precision=True, initial_expert_bits=8),
    "planned-floor": dict(dynamic_precision=True, initial_expert_bits=8),
    "planned-inline": dict(dynamic_precision=True, initial_expert_bits=8),
}
PLANNED = ("planned", "planned-floor", "planned-inline")
TOP_BITS = 8
WARMUP_PROMPT_LEN = 16
WARMUP_MAX_TOKENS = 4
COMPILE_WARM_TOKENS = 4  # tokens per request of warm_compile_cache: past prefill into decode
WARM_PROMPT_OFFSET = 1 << 20  # prompt indices of warm_compile_cache, far from any case's
TRICKLE_PROMPT_LEN = 32
TRICKLE_MAX_TOKENS = 8
OUTPUT_TIMEOUT_S = 900.0
FIRST_PLAN_TIMEOUT_S = 60.0
POLL_S = 0.05
TELEMETRY_INTERVAL_MS = 250
HISTORY_SETTLE_S = 2.0  # > the controlplane's plan_min_interval_s (1 s) plus a telemetry report
ARRIVAL_SEED = 0  # every case sees the same arrival times
PROMPT_SPLIT = "validation"  # prompts from the corpus never come from the split quality is measured on

Prompts = Callable[[int, int], list[int]]  # (request index, length) -> token ids


def synthetic_prompts(vocab: int) -> Prompts:
    """Distinct from their first token on: no two requests share a cached prefix."""
    return lambda i, length: [(31 * i + 7 * j + 3) % (vocab - 10) + 10 for j in range(length)]


def corpus_prompts(tokens_dir: Path, domains: list[str], count: int, length: int) -> Prompts:
    """Request i takes a validation window of domain i mod len(domains), cut to its length."""
    per_domain = -(-count // len(domains))
    windows = {d: split_windows(tokens_dir, d, PROMPT_SPLIT, length + 1, per_domain).inputs for d in domains}

    def prompt(i: int, n: int) -> list[int]:
        rows = windows[domains[i % len(domains)]]
        return rows[(i // len(domains)) % rows.shape[0], :n].tolist()

    return prompt


class TimedSink(QueueSink):
    """A QueueSink that notes when its request's first output arrived (engine thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted_at = time.perf_counter()
        self.first_output_at: float | None = None

    def __call__(self, output) -> None:
        if self.first_output_at is None:
            self.first_output_at = time.perf_counter()
        super().__call__(output)


@dataclass
class Burst:
    seconds: float  # from the first submission until the last request finished
    tokens: int  # generated
    first_token_s: list[float]  # per request, from its submission to its first output
    sequences: list[list[int]]  # per request, prompt then generated token ids


def arrival_gaps(n: int, rate_per_s: float, seed: int) -> list[float]:
    """Seconds before each of n submissions: 0 for all (one burst) at rate 0, else a
    Poisson stream (exponential gaps, the first request at once)."""
    if rate_per_s <= 0:
        return [0.0] * n
    gen = random.Random(seed)
    return [0.0, *(gen.expovariate(rate_per_s) for _ in range(n - 1))]


def run_requests(engine, tag: str, n: int, length: int, max_tokens: int, prompts: Prompts,
                 gaps: list[float] | None = None) -> Burst:
    """Submits n requests (at once, or after ``gaps``) and waits for all of them."""
    sinks, sequences = [], []
    start = time.perf_counter()
    for i, gap in enumerate(gaps or [0.0] * n):
        if gap:
            time.sleep(gap)
        sink = TimedSink()
        sequences.append(prompts(i, length))
        engine.add_request(f"{tag}-{i}", sequences[-1], SamplingParams(max_tokens=max_tokens, ignore_eos=True), sink)
        sinks.append(sink)
    for sink, sequence in zip(sinks, sequences):
        for output in sink.outputs(timeout=OUTPUT_TIMEOUT_S):
            sequence.extend(output.new_token_ids)
    tokens = sum(len(seq) for seq in sequences) - n * length
    return Burst(time.perf_counter() - start, tokens, [s.first_output_at - s.submitted_at for s in sinks], sequences)


def config_for(args: argparse.Namespace, case: str, max_arena_pages: int | None, **extra) -> DataplaneConfig:
    model = dict(model_path=args.model) if args.model else dict(synthetic=args.preset)
    return DataplaneConfig(
        **model, device=args.device, dtype="bfloat16" if args.device != "cpu" else "float32",
        max_running_seqs=args.requests, max_batched_tokens=args.max_batched_tokens,
        max_context_length=args.prompt_len + args.max_tokens + WARMUP_PROMPT_LEN,
        max_arena_pages=max_arena_pages, low_watermark=args.low_watermark,
        high_watermark=args.high_watermark, warm_up=args.engine_warm_up, **CASES[case], **extra,
    )


def probe(args: argparse.Namespace) -> dict:
    """Arena pages of the experts at 8 bits and the page size (one build)."""
    built = build(config_for(args, "static-8", None))
    store = built.precision.store
    return {"weight_pages_8bit": sum(store.block_pages(b, TOP_BITS) for b in range(store.num_blocks)),
            "page_bytes": built.engine.arena.page_bytes, "kv_block_size": built.engine.kv.block_size}


def warm_compile_cache(args: argparse.Namespace, max_arena_pages: int) -> dict:
    """Serves the burst's prompts with a few tokens each under the dynamic
    ladder in the benchmark's arena, and throws the result away: the Triton
    kernels of the burst's shapes (prefill chunks of the full token budget,
    steps that mix prefill and decode, demoted views) are compiled into
    Triton's on-disk cache, which every later case's process reads. Without
    it the first timed case pays those compilations: the planned case, run
    first, lost 1.3 s in its first prefill step and 2.8 s
    in its ninth against the fallback order run after it (H100, session 41,
    memory_pressure_gap_h100_s41.json); the fallback order run first on an
    empty cache lost the same (memory_pressure_warmup_h100_s42.json)."""
    start = time.perf_counter()
    dataplane = Dataplane(config_for(args, "dynamic", max_arena_pages))
    try:
        engine = dataplane.engine
        prompts = synthetic_prompts(engine.model_info.vocab_size)
        dataplane.start()
        warm_buckets(dataplane, args.requests, prompts)
        run_requests(engine, "compile", args.requests, args.prompt_len, COMPILE_WARM_TOKENS,
                     lambda i, n: prompts(WARM_PROMPT_OFFSET + i, n))
    finally:
        dataplane.stop()
    return {"seconds": time.perf_counter() - start}


def warm_buckets(dataplane: Dataplane, largest: int, prompts: Prompts) -> None:
    """Compiles kernels and captures the decode graphs of every bucket up to
    ``largest`` rows, unless the dataplane's start-up warm-up ran (it covers
    every bucket: dataplane/warmup.py)."""
    if dataplane.warmup is not None:
        return
    engine = dataplane.engine
    graphs = engine.runner.graphs
    buckets = [b for b in graphs.buckets if b <= largest] if graphs is not None else [1, largest]
    for n in buckets:
        run_requests(engine, f"warm{n}", n, WARMUP_PROMPT_LEN, WARMUP_MAX_TOKENS, prompts)


def run_history(engine, args: argparse.Namespace, prompts: Prompts) -> None:
    """Serves ``--history-requests`` requests in groups that fit next to 8-bit experts, so that the
    controlplane's activity table has the workload's routing before the timed load (a server that
    has run a while), then lets a plan built on it arrive."""
    if not args.history_requests:
        return
    group = max(1, args.kv_seqs // 2)
    for start in range(0, args.history_requests, group):
        n = min(group, args.history_requests - start)
        run_requests(engine, f"history{start}", n, args.prompt_len, args.max_tokens,
                     lambda i, length: prompts(start + i, length))
    time.sleep(HISTORY_SETTLE_S)


def wait_for_plan(dataplane: Dataplane) -> None:
    deadline = time.perf_counter() + FIRST_PLAN_TIMEOUT_S
    while dataplane.plans.get() is None:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"no plan from the controlplane within {FIRST_PLAN_TIMEOUT_S:g} s")
        time.sleep(POLL_S)


def run_case(args: argparse.Namespace, case: str, max_arena_pages: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if case not in PLANNED:
            return run_dataplane(args, case, max_arena_pages, {}, lambda: None)
        floor = {"default_floor_bits": args.floor_bits} if case == "planned-floor" else {}
        planner = PlannerConfig(**{"low_watermark": args.low_watermark, "high_watermark": args.high_watermark,
                                   **floor, **json.loads(args.planner)})
        serve = controlplane_inline if case == "planned-inline" else controlplane_process
        with serve(tmp, planner) as (address, controlplane_cpu):
            extra = dict(controlplane=address, telemetry_interval_ms=TELEMETRY_INTERVAL_MS)
            return run_dataplane(args, case, max_arena_pages, extra, controlplane_cpu)


def run_dataplane(args: argparse.Namespace, case: str, max_arena_pages: int, extra: dict,
                  controlplane_cpu: Callable[[], float | None]) -> dict:
    t0 = time.perf_counter()
    dataplane = Dataplane(config_for(args, case, max_arena_pages, **extra))
    build_s = time.perf_counter() - t0
    try:
        return measure(args, case, dataplane, build_s, controlplane_cpu)
    finally:
        dataplane.stop()


def measure(args: argparse.Namespace, case: str, dataplane: Dataplane, build_s: float,
            controlplane_cpu: Callable[[], float | None]) -> dict:
    engine = dataplane.engine
    trace = trace_steps(engine, dataplane.controller.store)
    prompts = synthetic_prompts(engine.model_info.vocab_size)
    if args.prompt_domains:
        prompts = corpus_prompts(args.tokens_dir, args.prompt_domains.split(","),
                                 args.requests + args.history_requests + args.requests, args.prompt_len)
    dataplane.start()
    if case in PLANNED:
        wait_for_plan(dataplane)
    # Warm-up and history take prompts past the burst's (indices offset), so none shares its cached prefix.
    warm_buckets(dataplane, args.requests, lambda i, n: prompts(args.requests + args.history_requests + i, n))
    run_history(engine, args, lambda i, n: prompts(args.requests + i, n))
    before = engine.stats()
    transitions_before = replace(dataplane.controller.store.counters)
    controlplane_cpu_before = controlplane_cpu()
    trace.clear()
    gaps = arrival_gaps(args.requests, args.arrival_rate, ARRIVAL_SEED)
    run = run_requests(engine, "burst", args.requests, args.prompt_len, args.max_tokens, prompts, gaps)
    ended_at = time.perf_counter()
    controlplane_cpu_after = controlplane_cpu()
    after = engine.stats()
    transitions = dataplane.controller.store.counters
    iteration_s = trace.iteration_seconds(ended_at)
    row = {  # read from the trace before the trickle (recover) adds iterations to it
        "case": case, "build_seconds": build_s, "arena_pages": engine.arena.num_pages,
        "engine_warm_up_s": dataplane.warmup.seconds if dataplane.warmup is not None else None,
        "engine_warm_up_round_s": list(dataplane.warmup.round_seconds) if dataplane.warmup is not None else None,
        "requests": args.requests, "tokens": run.tokens, "seconds": run.seconds,
        "tok_per_s": run.tokens / run.seconds,
        "arrival_rate_per_s": args.arrival_rate,
        "first_token_s_median": statistics.median(run.first_token_s),
        "first_token_s_p90": statistics.quantiles(run.first_token_s, n=10)[-1] if len(run.first_token_s) > 1
        else run.first_token_s[0],
        "first_token_s_max": max(run.first_token_s),
        "preemptions": after.preemptions_total - before.preemptions_total,
        "engine_iterations": len(trace.state_ids),
        "mean_running": statistics.fmean(trace.running) if trace.running else 0.0,
        "peak_running": max(trace.running, default=0),
        "mean_expert_bits": statistics.fmean(trace.mean_bits) if trace.mean_bits else 0.0,
        "min_expert_bits": min(trace.mean_bits, default=0.0),
        "deepest_block_bits": trace.deepest_state(),
        "served_block_bits": trace.served_states(after.generated_tokens_total, args.served_states),
        "weight_pages_by_bits_after_burst": after.arena.weight_pages_by_bits,
        # Where the time went: per engine iteration, and in the precision controller's hook.
        "iteration_s_median": statistics.median(iteration_s) if iteration_s else 0.0,
        "iteration_s_p90": statistics.quantiles(iteration_s, n=10)[-1] if len(iteration_s) > 1 else 0.0,
        "controller_s_total": sum(trace.controller_s),
        "controller_s_max": max(trace.controller_s, default=0.0),
        "demotions": transitions.demotions - transitions_before.demotions,
        "promotions": transitions.promotions - transitions_before.promotions,
        "bytes_promoted": transitions.bytes_promoted - transitions_before.bytes_promoted,
        "bytes_demoted": transitions.bytes_demoted - transitions_before.bytes_demoted,
        # CPU seconds the controlplane's own process spent during the burst (planned cases).
        "controlplane_cpu_s": None if controlplane_cpu_before is None or controlplane_cpu_after is None
        else controlplane_cpu_after - controlplane_cpu_before,
        # Per iteration (rounded): seconds since the burst's first iteration, seconds in it and in the
        # controller's hook, running requests and mean expert bits, to place a difference in time.
        "iterations": {
            "start_s": [round(t - trace.started_at[0], 4) for t in trace.started_at],
            # The first iteration's start on the wall clock, to place file times (e.g. Triton's cache) in it.
            "first_start_epoch_s": time.time() - (time.perf_counter() - trace.started_at[0]) if trace.started_at else None,
            "wall_s": [round(t, 5) for t in iteration_s],
            "controller_s": [round(t, 5) for t in trace.controller_s],
            "running": list(trace.running),
            "mean_bits": [round(b, 3) for b in trace.mean_bits],
            "replays": list(trace.replays),
            "host_reads": list(trace.host_reads),
            "host_only_blocks": [sum(b == 0 for b in trace.states[i]) for i in trace.state_ids],
            # [iteration, kernel] of each Triton kernel variant compiled live during the burst.
            "compiled_kernels": [list(c) for c in trace.compiled],
        },
    }
    if case == "static-8":  # the 8-bit model's own text: what the other cases' states are scored on too
        row["served_token_ids"] = run.sequences
    if case in PLANNED:
        row["plans_received"] = dataplane.plans.received_total
    if case == "planned-floor":
        row["floor_bits"] = args.floor_bits
    if CASES[case]["dynamic_precision"]:
        row.update(recover(engine, trace, args.recovery_s))
    return row


def recover(engine, trace: StepTrace, limit_s: float) -> dict:
    """Single short requests, one after another, until every block is back at 8 bits or ``limit_s``."""
    prompts = synthetic_prompts(engine.model_info.vocab_size)
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < limit_s:
        if trace.mean_bits and trace.mean_bits[-1] == TOP_BITS:
            break
        run_requests(engine, f"trickle{sent}", 1, TRICKLE_PROMPT_LEN, TRICKLE_MAX_TOKENS, prompts)
        sent += 1
    back = bool(trace.mean_bits) and trace.mean_bits[-1] == TOP_BITS
    return {"recovery_seconds": time.perf_counter() - start if back else None, "trickle_requests": sent,
            "mean_expert_bits_after_trickle": trace.mean_bits[-1] if trace.mean_bits else None,
            "weight_pages_by_bits_after_trickle": engine.stats().arena.weight_pages_by_bits}
