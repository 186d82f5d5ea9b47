"""Prefix caching on the default model: what reusing cached K/V saves.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/prefix_cache.py --out benchmarks/results/prefix_cache_cpu.json

The engine in process (the dataplane's own, paged experts as served), run
twice per workload, prefix caching on and off (`--no-prefix-caching`):

* shared_prefix: ``--requests`` requests of one shared system text plus a
  question of their own, ``--concurrency`` in flight at a time;
* multi_turn: ``--conversations`` conversations of ``--turns`` turns each,
  every turn's prompt being the previous prompt, its answer and a new
  question (the conversations run side by side, each turn after the last);
* parallel_choices: ``--prompts`` prompts of ``--prefix-tokens`` tokens, each
  sent ``--choices`` times at once (an OpenAI request with n choices), one
  prompt after the other.

Recorded per run: prompt tokens computed and taken from the cache, time to
first token (median, p90) and the workload's wall time. Greedy decoding with
ignore_eos, so both runs generate the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.provenance import cpu_header  # noqa: E402
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine import Engine  # noqa: E402
from dataplane.engine_builder import build_engine  # noqa: E402
from dataplane.engine_io import QueueSink  # noqa: E402
from dataplane.sampling_params import SamplingParams  # noqa: E402
from launcher.processes import DEFAULT_MODEL  # noqa: E402

TIMEOUT_S = 600.0
# Token ids drawn from this range make the synthetic texts (the model is
# random-text trained; ids avoid the specials at the bottom of the vocabulary).
FIRST_ID, LAST_ID = 10, 300


def synthetic(n: int, seed: int) -> list[int]:
    """n deterministic token ids, different for each seed."""
    span = LAST_ID - FIRST_ID
    return [FIRST_ID + (seed * 7919 + i * 104729) % span for i in range(n)]


class Timed:
    """Runs one request and records its time to first token."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ttft_s: list[float] = []
        self._lock = threading.Lock()
        self._next = 0

    def run(self, prompt: list[int], max_tokens: int) -> list[int]:
        with self._lock:
            rid = f"r{self._next}"
            self._next += 1
        sink = QueueSink()
        start = time.perf_counter()
        self.engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), sink)
        tokens: list[int] = []
        for out in sink.outputs(timeout=TIMEOUT_S):
            if out.new_token_ids and not tokens:
                with self._lock:
                    self.ttft_s.append(time.perf_counter() - start)
            tokens += out.new_token_ids
        return tokens


def shared_prefix(timed: Timed, args: argparse.Namespace) -> None:
    system = synthetic(args.prefix_tokens, seed=1)
    prompts = [system + synthetic(args.question_tokens, seed=100 + i) for i in range(args.requests)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda p: timed.run(p, args.max_tokens), prompts))


def multi_turn(timed: Timed, args: argparse.Namespace) -> None:
    def conversation(c: int) -> None:
        prompt = synthetic(args.question_tokens * 2, seed=1000 + c)
        for turn in range(args.turns):
            answer = timed.run(prompt, args.max_tokens)
            prompt = prompt + answer + synthetic(args.question_tokens, seed=2000 + 10 * c + turn)

    with ThreadPoolExecutor(args.conversations) as pool:
        list(pool.map(conversation, range(args.conversations)))


def parallel_choices(timed: Timed, args: argparse.Namespace) -> None:
    for p in range(args.prompts):
        prompt = synthetic(args.prefix_tokens, seed=3000 + p)
        with ThreadPoolExecutor(args.choices) as pool:
            list(pool.map(lambda _: timed.run(prompt, args.max_tokens), range(args.choices)))


WORKLOADS = {"shared_prefix": shared_prefix, "multi_turn": multi_turn, "parallel_choices": parallel_choices}


def measure(workload: str, prefix_caching: bool, args: argparse.Namespace) -> dict:
    config = DataplaneConfig(model_path=str(args.model), prefix_caching=prefix_caching)
    engine = build_engine(config)
    engine.start()
    try:
        timed = Timed(engine)
        timed.run(synthetic(8, seed=0), 2)  # warm-up, not recorded
        timed.ttft_s.clear()
        before = engine.stats()
        start = time.perf_counter()
        WORKLOADS[workload](timed, args)
        wall_s = time.perf_counter() - start
        after = engine.stats()
    finally:
        engine.stop()
    ttft = sorted(timed.ttft_s)
    return {
        "prefix_caching": prefix_caching,
        "requests": len(ttft),
        "prompt_tokens_computed": after.prompt_tokens_total - before.prompt_tokens_total,
        "prompt_tokens_cached": after.prefix_cached_tokens_total - before.prefix_cached_tokens_total,
        "generated_tokens": after.generated_tokens_total - before.generated_tokens_total,
        "ttft_median_ms": round(1e3 * statistics.median(ttft), 2),
        "ttft_p90_ms": round(1e3 * ttft[int(0.9 * (len(ttft) - 1))], 2),
        "wall_s": round(wall_s, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--prefix-tokens", type=int, default=384)
    parser.add_argument("--question-tokens", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--choices", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = {
        "benchmark": "prefix caching (engine in process)",
        **cpu_header("benchmarks/prefix_cache.py", argv),
        "model": str(args.model.relative_to(REPO) if args.model.is_relative_to(REPO) else args.model),
        "workload_args": {k: v for k, v in vars(args).items() if k not in ("model", "out")},
        "workloads": {},
    }
    for workload in WORKLOADS:
        result["workloads"][workload] = [measure(workload, on, args) for on in (False, True)]
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'workload':14} {'cache':5} {'computed':>9} {'cached':>7} {'ttft p50 ms':>11} {'ttft p90 ms':>11} "
          f"{'wall s':>7}")
    for workload, runs in result["workloads"].items():
        for run in runs:
            print(f"{workload:14} {'on' if run['prefix_caching'] else 'off':5} {run['prompt_tokens_computed']:9d} "
                  f"{run['prompt_tokens_cached']:7d} {run['ttft_median_ms']:11.1f} {run['ttft_p90_ms']:11.1f} "
                  f"{run['wall_s']:7.2f}")


if __name__ == "__main__":
    main()
