"""How much any per-block bit allocation could gain, by the sensitivity
table's own prediction (CPU, seconds).

    .venv/bin/python benchmarks/allocation_bound.py

For each workload of the frontier (benchmarks/frontier.py: activity from
the VALIDATION windows) and each uniform view's budget, the predicted cost
(RungCost.state_cost: importance-weighted table cost) of

* the uniform view,
* the planner's budget state, and its greedy state without the uniform
  guard (what the guard's margin is compared with),
* a lower bound on every allocation of supported views to blocks that fits
  the budget: the Lagrangian dual max_lam sum_i min_v (c_i(v) + lam b_i(v)) -
  lam B (weak duality: no allocation within B costs less).

The ratio of the bound to the uniform cost caps the KL reduction that bit
allocation can promise at that budget, as far as the table predicts (the
frontier measures the real one). Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.policy_bits import planner_plan, uniform_bits, uniform_bytes, workload_activity  # noqa: E402
from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.quality_eval import PagedModel, load_domain_windows, routing_over  # noqa: E402
from controlplane.config import ControlplaneConfig, PlannerConfig  # noqa: E402
from controlplane.rungs import Constraints, PlanInputs, RungCost  # noqa: E402
from controlplane.sensitivity import BITS_AXIS, SENSITIVITY_FILE, load  # noqa: E402
from dataplane.profiling.corpus import corpus_domains  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HALF_LIFE_S = ControlplaneConfig.model_fields["activity_half_life_s"].default
# Multipliers tried for the dual (cost units per byte): the table's costs are
# ~1e-4..1 per block and blocks are ~1e4..1e5 bytes.
LAMBDAS = np.logspace(-13, -2, 6000)


def dual_bound(cost: np.ndarray, nbytes: np.ndarray, budget: int) -> float:
    """max over LAMBDAS of sum_i min_v (cost[i, v] + lam * nbytes[i, v]) - lam * budget.

    cost, nbytes: [blocks, views]."""
    best = -np.inf
    for lam in LAMBDAS:
        best = max(best, float((cost + lam * nbytes).min(axis=1).sum() - lam * budget))
    return best


def view_bytes(shape) -> np.ndarray:
    """float64 [3, V]: bytes of one block of each projection at each supported view."""
    return np.array([[shape.bytes_at(p, v) for v in shape.view_bits] for p in range(3)], dtype=np.float64)


def weighted_view_costs(shape, table, activity, budget: int, cfg: PlannerConfig) -> tuple[RungCost, np.ndarray]:
    """(the planner's RungCost at ``budget``, [L, E, 3, V] importance-weighted
    table cost of every block at every supported view)."""
    cost = RungCost(PlanInputs(shape, table, activity, uniform_bits(shape, shape.ceiling_bits),
                               Constraints(budget_bytes=budget)), cfg)
    per_view = np.stack([cost.importance[:, :, None] * table.cost[..., BITS_AXIS.index(v)] for v in shape.view_bits],
                        axis=-1)
    return cost, per_view


def frontier_workloads(tokens_dir: Path, single_domains: str) -> dict[str, list[str]]:
    """{"mix": every domain, each single domain: [it]} as benchmarks/frontier.py."""
    domains = corpus_domains(tokens_dir)
    return {"mix": domains, **{d: [d] for d in filter(None, single_domains.split(","))}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--activity-windows", type=int, default=16, help="validation windows per domain")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--single-domains", default="python,german")
    parser.add_argument("--out", type=Path, default=RESULTS / "allocation_bound_cpu.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, 8)
    shape, table, cfg = paged.shape, load(args.model / SENSITIVITY_FILE), PlannerConfig()
    views = list(shape.view_bits)
    nbytes = view_bytes(shape)  # [3, V]
    workloads = frontier_workloads(args.tokens_dir, args.single_domains)
    result = {"benchmark": "allocation bound (table-predicted)", **cpu_header("benchmarks/allocation_bound.py", argv),
              "model": str(args.model), "activity": {"split": "validation", "windows_per_domain": args.activity_windows},
              "workloads": {}}
    for name, doms in workloads.items():
        windows = load_domain_windows(args.tokens_dir, doms, "validation", args.seq_len, args.activity_windows)
        routed, mass = routing_over(paged, windows)
        activity = workload_activity(routed, mass, HALF_LIFE_S)
        rows = []
        for bits in views[1:-1]:
            budget = uniform_bytes(shape, bits)
            cost, per_view = weighted_view_costs(shape, table, activity, budget, cfg)  # per_view [L, E, 3, V]
            block_bytes = np.broadcast_to(nbytes, per_view.shape)  # [L, E, 3, V]
            bound = dual_bound(per_view.reshape(-1, len(views)), block_bytes.reshape(-1, len(views)), budget)
            uniform = cost.state_cost(uniform_bits(shape, bits))
            planned, ladder = planner_plan(shape, table, activity, budget, cfg)
            greedy, _ = planner_plan(shape, table, activity, budget, cfg.model_copy(update={"uniform_guard": False}))
            row = {"budget": f"uniform {bits}-bit", "budget_bytes": budget, "uniform_predicted": uniform,
                   "planner_predicted": cost.state_cost(planned), "planner_anchor": ladder.budget_anchor,
                   "greedy_predicted": cost.state_cost(greedy),
                   "any_allocation_at_least": bound, "max_predicted_reduction": 1.0 - bound / uniform}
            rows.append(row)
            print(f"{name:7s} {row['budget']}: uniform {uniform:.5f} planner {row['planner_predicted']:.5f} "
                  f"({ladder.budget_anchor}) greedy {row['greedy_predicted']:.5f} bound {bound:.5f} -> at most {row['max_predicted_reduction']:.1%}",
                  flush=True)
        result["workloads"][name] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
