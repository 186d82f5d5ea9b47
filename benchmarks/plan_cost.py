"""What one precision plan costs in Python, at real model shapes (CPU, seconds).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_cost.py

Per shape (layers x experts, views 2/3/4/6/8, the controlplane's fallback
table, a random routing and random current bits), the median over
``--repeats`` of:

* build: controlplane.planner.build_ladder (complete lists, both ways);
* convert: controlplane.convert.ladder_to_plan (the protobuf message);
* prepare: PrecisionController.set_plan, what the dataplane does with it on
  its telemetry thread (ladder_from_plan, checks, two RungWalkers);

and the serialized size. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import cpu_header  # noqa: E402
from controlplane.activity import ActivityTable  # noqa: E402
from controlplane.config import PlannerConfig  # noqa: E402
from controlplane.convert import ladder_to_plan  # noqa: E402
from controlplane.planner import build_ladder  # noqa: E402
from controlplane.rungs import Constraints, ModelShape, PlanInputs  # noqa: E402
from controlplane.sensitivity import fallback_table  # noqa: E402
from dataplane.precision.controller import PrecisionController  # noqa: E402
from dataplane.weights.store import WeightCounters  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VIEWS = (2, 3, 4, 6, 8)
BYTES_PER_BIT = 100_000  # block footprint per bit; only ratios matter to the planner
SHAPES = {"mixtral-8x7b": (32, 8, 2), "qwen1.5-moe-a2.7b": (24, 60, 4)}  # layers, experts, top_k
HALF_LIFE_S = 60.0
REPORT_MS = 1000


class IdleStore:
    """The WeightStore surface a PrecisionController reads until it walks: set_plan touches no blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.counters = WeightCounters()

    def block_bits(self) -> list[int]:
        return [VIEWS[-1]] * self.num_blocks


def one_plan(layers: int, experts: int, top_k: int, rng: np.random.Generator) -> dict:
    shape = ModelShape(layers, experts, top_k, VIEWS,
                       tuple({0: 0, **{b: b * BYTES_PER_BIT for b in VIEWS}} for _ in range(3)))
    table = fallback_table(layers, experts, (8.0 * BYTES_PER_BIT,) * 3, "plan_cost")
    activity = ActivityTable(layers, experts, HALF_LIFE_S)
    n = layers * experts
    activity.update(REPORT_MS, rng.integers(0, 100, n).tolist(), rng.random(n).tolist(), rng.random(n).tolist())
    inputs = PlanInputs(shape, table, activity.snapshot(), rng.choice(VIEWS, size=(layers, experts, 3)),
                        Constraints())
    cfg = PlannerConfig()
    controller = PrecisionController(IdleStore(n * 3), arena=None, num_experts=experts)
    t0 = time.perf_counter()
    ladder = build_ladder(inputs, cfg)
    t1 = time.perf_counter()
    plan = ladder_to_plan(ladder, 1, cfg)
    t2 = time.perf_counter()
    controller.set_plan(plan)
    t3 = time.perf_counter()
    return {"rungs_per_list": len(ladder.demotions), "bytes": plan.ByteSize(),
            "build_s": t1 - t0, "convert_s": t2 - t1, "prepare_s": t3 - t2}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_cost_cpu.json")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    result = {"benchmark": "precision plan cost in Python", **cpu_header("benchmarks/plan_cost.py", argv),
              "shapes": {}}
    print(f"{'shape':18} {'rungs':>6} {'KB':>6} {'build ms':>9} {'convert ms':>10} {'prepare ms':>10}")
    for name, (layers, experts, top_k) in SHAPES.items():
        runs = [one_plan(layers, experts, top_k, rng) for _ in range(args.repeats)]
        row = {"layers": layers, "experts": experts, "rungs_per_list": runs[0]["rungs_per_list"],
               "bytes": runs[0]["bytes"],
               **{k: statistics.median(r[k] for r in runs) for k in ("build_s", "convert_s", "prepare_s")}}
        result["shapes"][name] = row
        print(f"{name:18} {row['rungs_per_list']:6d} {row['bytes'] / 1e3:6.0f} {row['build_s'] * 1e3:9.1f} "
              f"{row['convert_s'] * 1e3:10.1f} {row['prepare_s'] * 1e3:10.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
