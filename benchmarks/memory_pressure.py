"""Serving under memory pressure at real shapes: static 8-bit, static 4-bit
and the dynamic precision ladder in one memory budget.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/memory_pressure.py --preset mixtral-8x7b --out benchmarks/results/memory_pressure_h200.json
    python benchmarks/memory_pressure.py --model models/pw-moe-tiny --out ...   # a checkpoint instead

The budget: the arena (weights and KV cache share it) holds the experts at 8
bits plus the KV cache of ``--kv-seqs`` full sequences, nothing more. A burst
of ``--requests`` requests (``--prompt-len`` prompt tokens, ``--max-tokens``
generated, ignore_eos) arrives at once. Cases:

* ``static-8``: experts stay at 8 bits; the scheduler can only hold what the
  KV room allows (the quality ceiling, the throughput floor);
* ``static-4``: experts stay at 4 bits; half the expert bytes go to KV;
* ``dynamic``: experts start at 8 bits and the dataplane walks its precision
  ladder (no controlplane: its local fallback order) as KV demand rises, then
  climbs back while a trickle of single short requests follows the burst.

The watermarks are fractions of the arena (``--low-watermark`` /
``--high-watermark``, recorded). The dataplane's defaults, 5 % / 15 %, were
set on the default model; on a ~48 GB Mixtral arena 15 % holds ~7 GB free,
which no tight budget has. Pick ``--kv-seqs`` so that its KV room is above the
high watermark, or the dynamic case cannot climb back to all 8 bits at idle.

Each case runs in its own process: a Mixtral-8x7B build holds ~54 GB of pinned
host masters, and two at once do not fit the machine's host memory. A probe
process first builds the model once to count the arena pages the experts take
at 8 bits (the budget is exact, not estimated).

Recorded per case: the burst's wall time and generated tokens per second,
time to first token (median and the last request's, from the burst's start),
preemptions, running requests (mean over steps, peak), the mean bits per
expert weight over the burst's steps (every block weighted by its weights) and
its minimum, and for ``dynamic`` the seconds until every block was back at 8
bits during the trickle. Kernels are compiled and graphs captured by a warm-up
of short requests at the batch buckets before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.provenance import git_commit  # noqa: E402
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine_builder import BuiltEngine, build  # noqa: E402
from dataplane.engine_io import QueueSink  # noqa: E402
from dataplane.kv_cache import blocks_for_tokens  # noqa: E402
from dataplane.sampling_params import SamplingParams  # noqa: E402

CASES = {
    "static-8": dict(dynamic_precision=False, initial_expert_bits=8),
    "static-4": dict(dynamic_precision=False, initial_expert_bits=4),
    "dynamic": dict(dynamic_precision=True, initial_expert_bits=8),
}
TOP_BITS = 8
WARMUP_PROMPT_LEN = 16
WARMUP_MAX_TOKENS = 4
TRICKLE_PROMPT_LEN = 32
TRICKLE_MAX_TOKENS = 8
OUTPUT_TIMEOUT_S = 900.0


def prompt(i: int, vocab: int, length: int) -> list[int]:
    """Distinct from its first token on: no two requests share a cached prefix."""
    return [(31 * i + 7 * j + 3) % (vocab - 10) + 10 for j in range(length)]


class TimedSink(QueueSink):
    """A QueueSink that notes when its request's first output arrived (engine thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_output_at: float | None = None

    def __call__(self, output) -> None:
        if self.first_output_at is None:
            self.first_output_at = time.perf_counter()
        super().__call__(output)


@dataclass
class Burst:
    seconds: float  # from the first submission until the last request finished
    tokens: int  # generated
    first_token_s: list[float]  # per request, from the submission to its first output


def run_requests(engine, tag: str, n: int, prompt_len: int, max_tokens: int) -> Burst:
    """Submits n requests at once and waits for all of them."""
    vocab = engine.model_info.vocab_size
    sinks = []
    start = time.perf_counter()
    for i in range(n):
        sink = TimedSink()
        engine.add_request(f"{tag}-{i}", prompt(i, vocab, prompt_len),
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True), sink)
        sinks.append(sink)
    tokens = sum(len(o.new_token_ids) for s in sinks for o in s.outputs(timeout=OUTPUT_TIMEOUT_S))
    return Burst(time.perf_counter() - start, tokens, [s.first_output_at - start for s in sinks])


@dataclass
class StepTrace:
    """Per engine-loop iteration, recorded on the engine thread (after the controller ran)."""

    times: list[float] = field(default_factory=list)
    mean_bits: list[float] = field(default_factory=list)  # over expert weights
    running: list[int] = field(default_factory=list)


def trace_steps(built: BuiltEngine) -> StepTrace:
    """Wraps the engine's before_step so each iteration records the expert bits and running requests."""
    engine, store = built.engine, built.precision.store
    weights = [rows * cols for rows, cols in (store.shape(b) for b in range(store.num_blocks))]
    total = sum(weights)
    trace = StepTrace()
    inner = engine.before_step

    def before_step() -> None:
        if inner is not None:
            inner()
        trace.times.append(time.perf_counter())
        trace.mean_bits.append(sum(w * bits for w, bits in zip(weights, store.block_bits())) / total)
        trace.running.append(len(engine.scheduler.running))

    engine.before_step = before_step
    return trace


def config_for(args: argparse.Namespace, case: str, max_arena_pages: int | None) -> DataplaneConfig:
    model = dict(model_path=args.model) if args.model else dict(synthetic=args.preset)
    return DataplaneConfig(
        **model, device=args.device, dtype="bfloat16" if args.device != "cpu" else "float32",
        max_running_seqs=args.requests, max_batched_tokens=args.max_batched_tokens,
        max_context_length=args.prompt_len + args.max_tokens + WARMUP_PROMPT_LEN,
        max_arena_pages=max_arena_pages, low_watermark=args.low_watermark,
        high_watermark=args.high_watermark, **CASES[case],
    )


def probe(args: argparse.Namespace) -> dict:
    """Arena pages of the experts at 8 bits and the page size (one build)."""
    built = build(config_for(args, "static-8", None))
    store = built.precision.store
    return {"weight_pages_8bit": sum(store.block_pages(b, TOP_BITS) for b in range(store.num_blocks)),
            "page_bytes": built.engine.arena.page_bytes, "kv_block_size": built.engine.kv.block_size}


def warm_up(engine, largest: int) -> None:
    """Compiles kernels and captures the decode graphs of every bucket up to ``largest`` rows."""
    graphs = engine.runner.graphs
    buckets = [b for b in graphs.buckets if b <= largest] if graphs is not None else [1, largest]
    for n in buckets:
        run_requests(engine, f"warm{n}", n, WARMUP_PROMPT_LEN, WARMUP_MAX_TOKENS)


def run_case(args: argparse.Namespace, case: str, max_arena_pages: int) -> dict:
    t0 = time.perf_counter()
    built = build(config_for(args, case, max_arena_pages))
    build_s = time.perf_counter() - t0
    engine = built.engine
    trace = trace_steps(built)
    engine.start()
    try:
        warm_up(engine, args.requests)
        before = engine.stats()
        trace.times.clear(), trace.mean_bits.clear(), trace.running.clear()
        run = run_requests(engine, "burst", args.requests, args.prompt_len, args.max_tokens)
        seconds, tokens = run.seconds, run.tokens
        after = engine.stats()
        burst = StepTrace(list(trace.times), list(trace.mean_bits), list(trace.running))
        row = {
            "case": case, "build_seconds": build_s, "arena_pages": engine.arena.num_pages,
            "requests": args.requests, "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "first_token_s_median": statistics.median(run.first_token_s),
            "first_token_s_max": max(run.first_token_s),
            "preemptions": after.preemptions_total - before.preemptions_total,
            "engine_iterations": len(burst.times),
            "mean_running": statistics.fmean(burst.running) if burst.running else 0.0,
            "peak_running": max(burst.running, default=0),
            "mean_expert_bits": statistics.fmean(burst.mean_bits) if burst.mean_bits else 0.0,
            "min_expert_bits": min(burst.mean_bits, default=0.0),
            "weight_pages_by_bits_after_burst": after.arena.weight_pages_by_bits,
        }
        if case == "dynamic":
            row.update(recover(engine, trace, args.recovery_s))
    finally:
        engine.stop()
    return row


def recover(engine, trace: StepTrace, limit_s: float) -> dict:
    """Single short requests, one after another, until every block is back at 8 bits or ``limit_s``."""
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < limit_s:
        if trace.mean_bits and trace.mean_bits[-1] == TOP_BITS:
            break
        run_requests(engine, f"trickle{sent}", 1, TRICKLE_PROMPT_LEN, TRICKLE_MAX_TOKENS)
        sent += 1
    back = bool(trace.mean_bits) and trace.mean_bits[-1] == TOP_BITS
    return {"recovery_seconds": time.perf_counter() - start if back else None, "trickle_requests": sent,
            "mean_expert_bits_after_trickle": trace.mean_bits[-1] if trace.mean_bits else None,
            "weight_pages_by_bits_after_trickle": engine.stats().arena.weight_pages_by_bits}


def child(args: argparse.Namespace) -> int:
    """One case (or the probe) in this process; its JSON goes to ``--row-out``."""
    if args.case == "probe":
        row = probe(args)
    else:
        row = run_case(args, args.case, args.max_arena_pages)
    args.row_out.write_text(json.dumps(row, default=str))
    return 0


def run_child(argv: list[str], extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        subprocess.run([sys.executable, __file__, *argv, *extra, "--row-out", str(out)], check=True)
        return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mixtral-8x7b", help="a synthetic model (dataplane/models/synthetic.py)")
    parser.add_argument("--model", help="a checkpoint folder instead of --preset")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--kv-seqs", type=int, default=16,
                        help="the budget's KV room next to 8-bit experts, in full sequences")
    parser.add_argument("--low-watermark", type=float, default=0.01)
    parser.add_argument("--high-watermark", type=float, default=0.03)
    parser.add_argument("--max-batched-tokens", type=int, default=4096)
    parser.add_argument("--cases", default="dynamic,static-4,static-8")
    parser.add_argument("--recovery-s", type=float, default=60.0,
                        help="dynamic: the longest the trickle after the burst may run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu: a dry run of the script (tiny presets)")
    parser.add_argument("--commit", default=None, help="commit of the measured tree (the GPU machine's .git is stale)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", choices=["probe", *CASES], help=argparse.SUPPRESS)  # child process
    parser.add_argument("--max-arena-pages", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:
        return child(args)
    if args.out is None:
        parser.error("--out is required")
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    common = [a for a in sys.argv[1:] if a not in ("--out", str(args.out))]
    shape = run_child(common, ["--case", "probe"])
    seq_pages = blocks_for_tokens(args.prompt_len + args.max_tokens, shape["kv_block_size"])
    budget_pages = shape["weight_pages_8bit"] + args.kv_seqs * seq_pages
    result = {
        "benchmark": "serving under memory pressure: static 8-bit, static 4-bit, dynamic precision",
        "command": " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "commit": git_commit(args.commit),
        "model": args.model or f"synthetic {args.preset}",
        "budget": {"arena_pages": budget_pages, "page_bytes": shape["page_bytes"],
                   "expert_pages_at_8_bits": shape["weight_pages_8bit"], "kv_pages_per_sequence": seq_pages,
                   "kv_seqs_next_to_8_bit_experts": args.kv_seqs,
                   "low_watermark": args.low_watermark, "high_watermark": args.high_watermark},
        "rows": [],
    }
    for case in cases:
        result["rows"].append(run_child(common, ["--case", case, "--max-arena-pages", str(budget_pages)]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\n{args.model or args.preset}: arena {budget_pages} pages of {shape['page_bytes'] / 2**10:.0f} KiB "
          f"(8-bit experts {shape['weight_pages_8bit']} + KV of {args.kv_seqs} x {seq_pages}); "
          f"{args.requests} requests x ({args.prompt_len} + {args.max_tokens}) tokens")
    print(f"{'case':9} {'tok/s':>8} {'s':>7} {'ttft med':>8} {'ttft max':>8} {'preempt':>7} {'run mean':>8} {'peak':>5} {'bits mean':>9} "
          f"{'bits min':>8} {'recover s':>9}")
    for r in result["rows"]:
        rec = r.get("recovery_seconds")
        print(f"{r['case']:9} {r['tok_per_s']:8.1f} {r['seconds']:7.2f} {r['first_token_s_median']:8.2f} "
              f"{r['first_token_s_max']:8.2f} {r['preemptions']:7d} "
              f"{r['mean_running']:8.1f} {r['peak_running']:5d} {r['mean_expert_bits']:9.2f} "
              f"{r['min_expert_bits']:8.2f} {'-' if rec is None else f'{rec:.2f}':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
