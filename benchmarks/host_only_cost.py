"""What serving host-only expert blocks costs in speed, on the default model (GPU; CPU for a dry run).

    python benchmarks/host_only_cost.py --plan benchmarks/results/frontier_floor0_cpu.json \\
        --workload german --out benchmarks/results/host_only_cost_h100.json

The quality side is the frontier's (benchmarks/frontier.py --floor-bits 0): a host-only block is
served at its master view, which the MoE kernels read in place from pinned host memory over the
host link (WeightStore: its page-table rows name the master's host pages), in the same launches
and CUDA graphs as resident blocks. The planner prices that by an expected stall per token
(PlannerConfig: read latency + bytes / host bandwidth, times the chance a token routes to the
expert). This measures it: the engine decodes prompts from the workload domain's test split under
the plan the frontier recorded for that workload at the budget (``--budget``, method planner), in
four states:

* ``plan``: the planner's bits, host-only blocks read from the host;
* ``plan, host-only at 8 bits``: the same blocks resident at the master view (more memory than the
  budget): the same weights, so the difference to ``plan`` is the host reads' cost
  (``extra_us_per_host_read``: the seconds between the two rounds over the plan's host reads);
  greedy tokens should match ``plan``'s (``tokens_equal_to_plan``; the down launch's atomic adds
  may round a near tie the other way);
* ``plan, host-only at 2 bits``: the same blocks resident at the lowest view;
* ``uniform 3-bit``: the static state at the uniform-3 budget.

Per state and batch: tok/s and the store's host reads per generated token, beside the plan's
predicted ``expected_fetch_s_per_token``. Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.precision_states import set_block_bits  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine_builder import build  # noqa: E402
from dataplane.engine_io import QueueSink  # noqa: E402
from dataplane.profiling.corpus import split_windows  # noqa: E402
from dataplane.sampling_params import SamplingParams  # noqa: E402
from dataplane.warmup import engine_warmup_rounds, warm_up  # noqa: E402
from dataplane.weights.layout import HOST_ONLY_BITS, VIEW_BITS  # noqa: E402

MODEL = REPO / "models" / "pw-moe-tiny"
TOKENS = REPO / "data" / "tokens"
PROMPT_LEN = 64
RESIDENT_MASTER = "plan, host-only at 8 bits"
# Seconds one warm-up round may take (a fresh Triton cache compiles each kernel variant live).
WARM_UP_ROUND_TIMEOUT_S = 600.0


def plan_entry(path: Path, workload: str, budget: str) -> dict:
    """The planner's state at ``budget`` in a frontier JSON (its bits, in block order)."""
    doc = json.loads(path.read_text())
    point = next((p for p in doc["workloads"][workload]["points"] if p["label"] == budget), None)
    if point is None:
        raise SystemExit(f"{path}: workload {workload!r} has no budget {budget!r}")
    entry = point["methods"]["planner"]
    if "bits" not in entry:
        raise SystemExit(f"{path}: no per-block bits recorded (a frontier from before session 53)")
    return {"bits": entry["bits"], "expected_fetch_s_per_token": entry["expected_fetch_s_per_token"],
            "host_only_blocks": sum(b == HOST_ONLY_BITS for b in entry["bits"]),
            "kl_mean": entry["mean"]["kl"], "frontier": str(path), "workload": workload, "budget": budget}


def decode_round(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Submits every prompt at once (greedy); (seconds, each request's generated tokens)."""
    start = time.perf_counter()
    sinks = []
    for i, ids in enumerate(prompts):
        sink = QueueSink()
        engine.add_request(f"h{i}-{time.monotonic_ns()}", ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                           sink)
        sinks.append(sink)
    tokens = [[t for o in s.outputs(timeout=600) for t in o.new_token_ids] for s in sinks]
    return time.perf_counter() - start, tokens


def measure(engine, store, states: dict[str, list[int]], prompts: list[list[int]], batches: list[int],
            max_tokens: int) -> list[dict]:
    rows = []
    generated: dict[tuple[str, int], list[list[int]]] = {}
    for name, bits in states.items():
        engine.run_on_engine_thread(lambda bits=bits: set_block_bits(store, bits))
        decode_round(engine, prompts[:1], 4)  # the state's first steps (graph replays or not) before timing
        for batch in batches:
            before = (store.counters.host_reads, store.counters.host_read_bytes)
            seconds, ids = decode_round(engine, prompts[:batch], max_tokens)
            generated[name, batch] = ids
            tokens = sum(map(len, ids))
            reads = store.counters.host_reads - before[0]
            rows.append({"state": name, "batch": batch, "tokens": tokens, "seconds": round(seconds, 4),
                         "tok_per_s": round(tokens / seconds, 2), "host_reads": reads,
                         "host_reads_per_token": round(reads / tokens, 3),
                         "host_read_bytes_per_token": round((store.counters.host_read_bytes - before[1]) / tokens)})
    timed = {(r["state"], r["batch"]): r for r in rows}
    for r in rows:
        r["tokens_equal_to_plan"] = generated[r["state"], r["batch"]] == generated["plan", r["batch"]]
        if r["state"] == "plan" and r["host_reads"] and (RESIDENT_MASTER, r["batch"]) in timed:
            extra_s = r["seconds"] - timed[RESIDENT_MASTER, r["batch"]]["seconds"]
            r["extra_us_per_host_read"] = round(extra_s * 1e6 / r["host_reads"], 2)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", type=Path, required=True, help="frontier JSON (benchmarks/frontier.py)")
    parser.add_argument("--workload", default="german")
    parser.add_argument("--budget", default="uniform 3-bit")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default=None, help="comma list (default 1,16 on CUDA, 1,2 on the CPU)")
    parser.add_argument("--max-tokens", type=int, default=None, help="per request (default 64 on CUDA, 8 on the CPU)")
    parser.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    args = parser.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    batches = [int(b) for b in (args.batches or ("1,16" if on_gpu else "1,2")).split(",")]
    max_tokens = args.max_tokens or (64 if on_gpu else 8)
    plan = plan_entry(args.plan, args.workload, args.budget)
    domain = args.workload if args.workload != "mix" else "english"
    windows = split_windows(TOKENS, domain, "test", PROMPT_LEN + 1, max(batches))
    prompts = [w.tolist() for w in windows.inputs]
    states = {"plan": plan["bits"],
              RESIDENT_MASTER: [b or VIEW_BITS[-1] for b in plan["bits"]],
              "plan, host-only at 2 bits": [b or VIEW_BITS[0] for b in plan["bits"]],
              "uniform 3-bit": [3] * len(plan["bits"])}
    built = build(DataplaneConfig(model_path=str(MODEL), device=args.device, dynamic_precision=False,
                                  max_arena_pages=4096))
    engine, store = built.engine, built.precision.store
    engine.start()
    try:
        # The served dataplane's start-up warm-up: nothing compiles while timed.
        warm_up(engine, engine_warmup_rounds(engine), WARM_UP_ROUND_TIMEOUT_S)
        rows = measure(engine, store, states, prompts, batches, max_tokens)
    finally:
        engine.stop()
    result = {
        "benchmark": "host-only serving cost",
        "command": " ".join(["benchmarks/host_only_cost.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
        "torch": torch.__version__,
        "commit": git_commit(args.commit),
        "model": str(MODEL.relative_to(REPO)),
        "prompts": {"domain": domain, "split": "test", "tokens": PROMPT_LEN, "max_tokens": max_tokens},
        "plan": {k: v for k, v in plan.items() if k != "bits"},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"plan: {plan['host_only_blocks']} host-only blocks, predicted stall "
          f"{plan['expected_fetch_s_per_token'] * 1e3:.3f} ms/token")
    print(f"{'state':28} {'B':>3} {'tok/s':>9} {'reads/tok':>9} {'KB/tok':>8} {'us/read':>8} {'= plan':>7}")
    for r in rows:
        print(f"{r['state']:28} {r['batch']:3d} {r['tok_per_s']:9.1f} {r['host_reads_per_token']:9.3f} "
              f"{r['host_read_bytes_per_token'] / 1e3:8.1f} {r.get('extra_us_per_host_read', 0.0):8.2f} "
              f"{str(r['tokens_equal_to_plan']):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
