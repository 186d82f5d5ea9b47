"""Chooses PlannerConfig.importance_exponent on the VALIDATION split (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/importance_exponent.py

The planner weights a block's table cost by importance = (E * share)^gamma
(controlplane/config.py). This sweeps gamma and measures, on held-out
VALIDATION windows (never the test split, which the frontier reports), the
mean KL(p_8bit || p) per token of the planner's bits at a few expert
budgets, per workload (as benchmarks/frontier.py: "mix" = all domains,
single-domain ones). The activity comes from ``--activity-windows``
validation windows per domain (the frontier's own activity windows); the
evaluation uses ``--windows`` other validation windows, disjoint from them
(midway between two activity windows). The uniform guard is off so that
the sweep measures the greedy ladder alone.

Score of a gamma: the geometric mean over (workload, budget) of
KL(planner) / KL(best static uniform that fits); the default is the gamma
with the lowest score. Writes JSON (benchmarks/results/importance_exponent_cpu.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.policy_bits import best_static, planner_bits, uniform_bits, uniform_bytes  # noqa: E402
from benchmarks.policy_bits import workload_activity  # noqa: E402
from benchmarks.quality_eval import PagedModel, evaluate, load_domain_windows, routing_over  # noqa: E402
from controlplane.config import ControlplaneConfig, PlannerConfig  # noqa: E402
from controlplane.sensitivity import SENSITIVITY_FILE, load  # noqa: E402
from dataplane.profiling.corpus import corpus_domains, split_windows  # noqa: E402
from models.train.lm_eval import EvalWindows  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HALF_LIFE_S = ControlplaneConfig.model_fields["activity_half_life_s"].default
ALL_WINDOWS = 1 << 30  # split_windows returns every window when asked for more


def disjoint_windows(tokens_dir: Path, domain: str, split: str, seq_len: int, count: int,
                     avoid_count: int) -> EvalWindows:
    """``count`` windows of the split, none of which is one of the
    ``avoid_count`` evenly spread windows split_windows would pick."""
    every = split_windows(tokens_dir, domain, split, seq_len, ALL_WINDOWS)
    total = every.inputs.shape[0]
    avoid = set(np.round(np.linspace(0, total - 1, min(avoid_count, total))).astype(np.int64).tolist())
    candidates = np.asarray([i for i in range(total) if i not in avoid])
    pick = candidates[np.unique(np.round(np.linspace(0, len(candidates) - 1, min(count, len(candidates))))
                                .astype(np.int64))]
    idx = torch.from_numpy(pick)
    return EvalWindows(every.inputs[idx], every.targets[idx])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--exponents", default="1.0,1.25,1.5,1.8,2.0,2.5")
    parser.add_argument("--budgets", default="3,3.5,4", help="uniform views (x.5 = midway in bytes)")
    parser.add_argument("--windows", type=int, default=24, help="evaluation windows per domain")
    parser.add_argument("--activity-windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--single-domains", default="python,german")
    parser.add_argument("--out", type=Path, default=RESULTS / "importance_exponent_cpu.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, args.batch)
    shape = paged.shape
    table = load(args.model / SENSITIVITY_FILE)
    exponents = [float(x) for x in args.exponents.split(",")]
    budgets = {}
    for label in args.budgets.split(","):
        lo = int(float(label))
        hi = next((v for v in shape.view_bits if v > lo), lo)
        frac = float(label) - lo
        budgets[label] = int(uniform_bytes(shape, lo) + frac * (uniform_bytes(shape, hi) - uniform_bytes(shape, lo)))
    domains = corpus_domains(args.tokens_dir)
    workloads = {"mix": domains, **{d: [d] for d in filter(None, args.single_domains.split(","))}}
    result = {
        "benchmark": "importance exponent on validation",
        **cpu_header("benchmarks/importance_exponent.py", argv),
        "eval": {"split": "validation", "windows_per_domain": args.windows,
                 "disjoint_from_activity_windows": args.activity_windows,
                 "kl": "mean KL(p_8bit || p) per counted position, nats (mean over the workload's domains)"},
        "budgets": budgets,
        "uniform_guard": False,
        "workloads": {},
    }
    ratios: dict[float, list[float]] = {g: [] for g in exponents}
    for name, doms in workloads.items():
        calib = load_domain_windows(args.tokens_dir, doms, "validation", args.seq_len, args.activity_windows)
        routed, mass = routing_over(paged, calib)
        activity = workload_activity(routed, mass, HALF_LIFE_S)
        configs: dict[str, np.ndarray] = {}
        for label, budget in budgets.items():
            configs[f"static@{label}"] = uniform_bits(shape, best_static(shape, budget))
            for g in exponents:
                cfg = PlannerConfig(importance_exponent=g, uniform_guard=False)
                configs[f"gamma={g}@{label}"] = planner_bits(shape, table, activity, budget, cfg)
        evals = {d: disjoint_windows(args.tokens_dir, d, "validation", args.seq_len, args.windows,
                                     args.activity_windows) for d in doms}
        unique: dict[str, np.ndarray] = {}
        alias = {}
        for key, bits in configs.items():
            alias[key] = bits.tobytes().hex()
            unique.setdefault(alias[key], bits)
        print(f"[{name}] {len(unique)} unique configurations x {len(doms)} domains", flush=True)
        quality = evaluate(paged, evals, unique)
        table_out = {}
        for key in configs:
            per = quality[alias[key]]
            table_out[key] = float(f"{np.mean([q.kl for q in per.values()]):.6g}")
        for label in budgets:
            base = table_out[f"static@{label}"]
            for g in exponents:
                ratios[g].append(table_out[f"gamma={g}@{label}"] / base)
        result["workloads"][name] = {"domains": doms, "mean_kl": table_out,
                                     "eval_tokens": {d: w.counted for d, w in evals.items()}}
        print(f"[{name}] {json.dumps(table_out)} ({time.perf_counter() - start:.0f} s)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    score = {str(g): float(f"{np.exp(np.mean(np.log(ratios[g]))):.6g}") for g in exponents}
    result["score_geomean_kl_ratio_vs_best_static"] = score
    result["best_exponent"] = float(min(score, key=score.get))
    result["wall_s"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"scores {score}; best {result['best_exponent']}")


if __name__ == "__main__":
    main()
