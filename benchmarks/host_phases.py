"""Host time per engine phase on a decode step, against the graph's GPU time.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/host_phases.py --out benchmarks/results/host_phases_h200.json

Builds the synthetic Mixtral-8x7B engine (4-bit experts, CUDA graphs) like
benchmarks/e2e_decode.py, wraps the engine's, scheduler's, runner's and
graphs' methods with wall-clock timers, and runs B requests together per
batch size. Reported per B (medians over the steps in which all B decode):
engine step (between step starts), runner step (launch to collect), the
graph's GPU time (CUDA events around the replay) and each wrapped method's
host time. Host time outside ``launch``..``collect`` leaves the GPU idle;
what the engine does between the two (the previous step's bookkeeping)
overlaps it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import e2e_decode as e2e  # noqa: E402
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine_builder import build  # noqa: E402

PHASES = {  # attribute path from the engine -> methods timed
    "": ["_receive", "_flush_bookkeeping", "_publish_stats", "_deliver", "_step"],
    "scheduler": ["schedule", "update"],
    "runner": ["decode_rows", "launch", "launch_ahead", "collect", "touch_routed"],
    "runner.graphs": ["_fill", "can_replay"],
    "runner.sampler": ["sample", "pick"],
}


def wrap(obj, name: str, label: str, times: dict[str, list[float]]) -> None:
    fn: Callable = getattr(obj, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times.setdefault(label, []).append(time.perf_counter() - start)
        return out

    setattr(obj, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="mixtral-8x7b")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--no-fuse-qkv", action="store_true")
    parser.add_argument("--overlap", action="store_true",
                        help="DataplaneConfig.overlap_steps (off: the phases of the one-step-at-a-time loop; "
                             "on, runner_step_ms spans about two steps)")
    parser.add_argument("--commit", default="unknown", help="git commit of the measured tree")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    prompt_len = 128
    config = DataplaneConfig(
        synthetic=args.preset, device="cuda", dtype="bfloat16", initial_expert_bits=args.bits,
        dynamic_precision=False, max_running_seqs=max(batches), max_batched_tokens=4096,
        max_context_length=prompt_len + args.steps + 16, fuse_qkv=not args.no_fuse_qkv,
        overlap_steps=args.overlap,
    )
    built = build(config)
    engine = built.engine
    runner, graphs = engine.runner, engine.runner.graphs
    if graphs is None:
        raise SystemExit("needs CUDA graphs (a CUDA device)")
    times: dict[str, list[float]] = {}
    for path, names in PHASES.items():
        obj = engine
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part)
        for name in names:
            wrap(obj, name, f"{path + '.' if path else 'engine.'}{name}", times)
    events: list[tuple[torch.cuda.Event, torch.cuda.Event, int]] = []
    replay = graphs.replay

    def timed_replay(rows, **kwargs):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = replay(rows, **kwargs)
        end.record()
        events.append((begin, end, len(rows)))
        return out

    graphs.replay = timed_replay
    log = e2e.StepLog()
    e2e.instrument(runner, log)
    engine.start()
    rows = []
    try:
        for b in batches:
            e2e.run_batch(engine, b, prompt_len, 4, f"warm-{b}")
        for b in batches:
            times.clear()
            events.clear()
            step = e2e.measure(engine, log, b, prompt_len, args.steps, built.precision.store, 0, 0, 1.0)
            torch.cuda.synchronize()
            gpu = [begin.elapsed_time(end) for begin, end, n in events if n == b]
            rows.append({
                "batch": b, "engine_step_ms": step["engine_step_ms"], "runner_step_ms": step["step_ms"],
                "graph_gpu_ms": statistics.median(gpu),
                "host_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
                "calls": {k: len(v) for k, v in times.items()},
            })
    finally:
        engine.stop()
    result = {
        "command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": args.commit,
        "preset": args.preset, "bits": args.bits, "fuse_qkv": not args.no_fuse_qkv,
        "overlap_steps": args.overlap, "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    labels = ["engine_step_ms", "runner_step_ms", "graph_gpu_ms"] + sorted(rows[0]["host_ms"])
    print(f"{'ms (median)':32}" + "".join(f"{'B=' + str(r['batch']):>9}" for r in rows))
    for label in labels:
        vals = [r.get(label, r["host_ms"].get(label, float("nan"))) for r in rows]
        print(f"{label:32}" + "".join(f"{v:9.3f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
