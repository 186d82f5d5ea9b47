"""What structured output costs a decode step: the same batch with and
without a JSON grammar, on the in-process engine of the default model.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/structured_output.py --out benchmarks/results/structured_output_cpu.json

Each run sends ``--batch`` requests at once, ``--max-tokens`` tokens each
(ignore_eos for plain text; the grammar's requests ask for an array of at
least ``--max-tokens`` booleans, which cannot close before the limit: both
runs generate the same number of tokens). Recorded: generated tokens per
second over the batch's wall time, and the grammar's first compile (the
tokenizer's vocabulary read once per engine) apart from the timed runs.
"""

from __future__ import annotations

import argparse
import json
import sys
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
from dataplane.sampling_params import SamplingParams, StructuredOutput  # noqa: E402
from launcher.processes import DEFAULT_MODEL  # noqa: E402

TIMEOUT_S = 600.0
PROMPT = [1, 20, 21, 22, 23, 24, 25, 26]


def batch_tokens_per_s(engine: Engine, batch: int, params: SamplingParams, tag: str) -> tuple[float, int]:
    """(generated tokens per second, tokens) of ``batch`` requests sent at once."""

    def one(i: int) -> int:
        sink = QueueSink()
        engine.add_request(f"{tag}{i}", PROMPT, params, sink)
        return sum(len(out.new_token_ids) for out in sink.outputs(timeout=TIMEOUT_S))

    start = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        tokens = sum(pool.map(one, range(batch)))
    return tokens / (time.perf_counter() - start), tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    schema = {"type": "array", "items": {"type": "boolean"}, "minItems": args.max_tokens}
    grammar = StructuredOutput("json_schema", json.dumps(schema))
    engine = build_engine(DataplaneConfig(model_path=str(args.model)))
    engine.start()
    try:
        start = time.perf_counter()
        engine.grammars.start(grammar)
        first_compile_s = time.perf_counter() - start
        runs: dict[str, list[float]] = {"plain": [], "json_schema": []}
        tokens: dict[str, int] = {}
        for r in range(args.rounds + 1):  # round 0 warms up, not recorded
            for name, params in (
                ("plain", SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)),
                ("json_schema", SamplingParams(max_tokens=args.max_tokens, structured_output=grammar)),
            ):
                rate, count = batch_tokens_per_s(engine, args.batch, params, f"{name}-{r}-")
                if r:
                    runs[name].append(round(rate, 1))
                    tokens[name] = count
    finally:
        engine.stop()
    result = {
        "benchmark": "structured output cost (engine in process)",
        **cpu_header("benchmarks/structured_output.py", argv),
        "model": str(args.model.relative_to(REPO) if args.model.is_relative_to(REPO) else args.model),
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "schema": schema,
        "first_compile_s": round(first_compile_s, 3),
        "tokens_per_s": runs,
        "tokens_per_run": tokens,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"first grammar compile: {first_compile_s:.3f} s")
    print(f"{'run':12} {'tokens':>6} {'tok/s per round':>30}")
    for name, rates in runs.items():
        print(f"{name:12} {tokens[name]:6d} {', '.join(f'{rate:.1f}' for rate in rates):>30}")


if __name__ == "__main__":
    main()
