"""Domain shift: bits follow the workload from domain A to domain B (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/domain_shift.py [--a python --b german]

The controlplane's ActivityTable (half-life from ControlplaneConfig) is fed
simulated telemetry reports of ``--report-ms`` each: the routing the paged
model (at its current bits) records on ``--windows-per-report`` validation
windows of domain A, then of domain B; the running demand is the window's
router probability mass. After every report the planner re-plans at a fixed
expert budget (uniform 3-bit bytes by default) and the store moves to the
plan's bits (planner budget rungs + kept promotions, benchmarks/policy_bits.py).

Recorded per step: the mean bits of A's and B's top experts (per layer the
``--top`` experts whose routed share in that domain exceeds the other's the
most, from 8-bit routing on validation windows), the bits each domain sees
(mean bits weighted by its routed shares), and every ``--eval-every`` steps
KL(p_8bit || p) and perplexity on a fixed TEST subset of A and of B.
Anchors: uniform 3-bit and the steady-state plan of each domain alone.
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

from benchmarks.frontier_plot import plot_domain_shift  # noqa: E402
from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.policy_bits import planner_bits, uniform_bits, uniform_bytes, workload_activity  # noqa: E402
from benchmarks.quality_eval import (  # noqa: E402
    PagedModel,
    current_quality,
    load_domain_windows,
    reference_log_probs,
)
from controlplane.activity import ActivityTable  # noqa: E402
from controlplane.config import ControlplaneConfig, PlannerConfig  # noqa: E402
from controlplane.sensitivity import SENSITIVITY_FILE, load  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HALF_LIFE_S = ControlplaneConfig.model_fields["activity_half_life_s"].default


def shares(routed: np.ndarray) -> np.ndarray:
    return routed / routed.sum(axis=1, keepdims=True)  # [L, E]


def specific_experts(share_x: np.ndarray, share_y: np.ndarray, top: int) -> np.ndarray:
    """[L, E] bool: per layer the ``top`` experts with the largest share_x - share_y."""
    order = np.argsort(-(share_x - share_y), axis=1)[:, :top]  # [L, top]
    mask = np.zeros(share_x.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    return mask


def bits_summary(bits: np.ndarray, top_a: np.ndarray, top_b: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> dict:
    expert_bits = bits.mean(axis=2)  # [L, E]
    return {"mean_bits_top_a": round(float(expert_bits[top_a].mean()), 4),
            "mean_bits_top_b": round(float(expert_bits[top_b].mean()), 4),
            "routed_weighted_bits_a": round(float((expert_bits * sa).sum() / sa.sum()), 4),
            "routed_weighted_bits_b": round(float((expert_bits * sb).sum() / sb.sum()), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--a", default="python")
    parser.add_argument("--b", default="german")
    parser.add_argument("--budget-bits", type=int, default=3, help="budget = bytes of this uniform view")
    parser.add_argument("--report-ms", type=float, default=5000.0)
    parser.add_argument("--reports-a", type=int, default=24)
    parser.add_argument("--reports-b", type=int, default=48)
    parser.add_argument("--windows-per-report", type=int, default=2)
    parser.add_argument("--traffic-windows", type=int, default=32, help="validation windows per domain")
    parser.add_argument("--test-windows", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "domain_shift_cpu.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, args.batch)
    shape, cfg = paged.shape, PlannerConfig()
    table = load(args.model / SENSITIVITY_FILE)
    budget = uniform_bytes(shape, args.budget_bits)
    a, b = args.a, args.b
    traffic = load_domain_windows(args.tokens_dir, [a, b], "validation", args.seq_len, args.traffic_windows)
    tests = load_domain_windows(args.tokens_dir, [a, b], "test", args.seq_len, args.test_windows)
    refs = {d: reference_log_probs(paged, w) for d, w in tests.items()}  # leaves the model at 8 bits
    reference = {d: current_quality(paged, tests[d], refs[d]).as_dict() for d in (a, b)}
    routing = {d: paged.routing(traffic[d]) for d in (a, b)}  # 8-bit routing: (routed, mass)
    sa, sb = shares(routing[a][0]), shares(routing[b][0])
    top_a, top_b = specific_experts(sa, sb, args.top), specific_experts(sb, sa, args.top)

    def quality() -> dict:
        return {d: current_quality(paged, tests[d], refs[d]).as_dict() for d in (a, b)}

    anchors = {}
    for name, bits in (("uniform", uniform_bits(shape, args.budget_bits)),
                       (f"steady_{a}", planner_bits(shape, table, workload_activity(*routing[a], HALF_LIFE_S),
                                                    budget, cfg)),
                       (f"steady_{b}", planner_bits(shape, table, workload_activity(*routing[b], HALF_LIFE_S),
                                                    budget, cfg))):
        paged.set_bits(bits)
        anchors[name] = {**bits_summary(bits, top_a, top_b, sa, sb), "quality": quality()}
        print(f"[anchor] {name}: {anchors[name]}", flush=True)

    activity = ActivityTable(shape.num_layers, shape.num_experts, HALF_LIFE_S)
    paged.set_bits(uniform_bits(shape, args.budget_bits))
    steps = []
    schedule = [a] * args.reports_a + [b] * args.reports_b
    cursor = {a: 0, b: 0}
    for i, domain in enumerate(schedule):
        n = traffic[domain].inputs.shape[0]
        idx = [(cursor[domain] + j) % n for j in range(args.windows_per_report)]
        cursor[domain] += args.windows_per_report
        stats = paged.window_routing(traffic[domain].inputs[idx])  # routing at the current bits
        mass = stats.prob_mass.double().numpy().reshape(-1)
        activity.update(args.report_ms, stats.routed_tokens.numpy().reshape(-1), mass, mass)
        bits = planner_bits(shape, table, activity.snapshot(), budget, cfg)
        paged.set_bits(bits)
        step = {"step": i + 1, "time_s": (i + 1) * args.report_ms / 1000.0, "traffic": domain,
                "expert_bytes": shape.expert_bytes(bits), **bits_summary(bits, top_a, top_b, sa, sb)}
        if (i + 1) % args.eval_every == 0 or i + 1 == args.reports_a:
            step["quality"] = quality()
            print(f"[shift] t={step['time_s']:.0f}s {domain}: top-A bits {step['mean_bits_top_a']}, "
                  f"top-B bits {step['mean_bits_top_b']}, KL {a} {step['quality'][a]['kl']:.4f} "
                  f"{b} {step['quality'][b]['kl']:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
        steps.append(step)

    result = {
        "benchmark": "domain shift",
        **cpu_header("benchmarks/domain_shift.py", argv),
        "model": str(args.model), "domain_a": a, "domain_b": b,
        "budget_bytes": budget, "budget_label": f"uniform {args.budget_bits}-bit bytes",
        "half_life_s": HALF_LIFE_S, "report_ms": args.report_ms,
        "switch_time_s": args.reports_a * args.report_ms / 1000.0,
        "traffic": {"split": "validation", "windows_per_report": args.windows_per_report,
                    "tokens_per_report": args.windows_per_report * args.seq_len},
        "test_tokens": {d: w.counted for d, w in tests.items()},
        "top_experts": {a: np.argwhere(top_a).tolist(), b: np.argwhere(top_b).tolist()},
        "routed_share_8bit": {a: np.round(sa, 4).tolist(), b: np.round(sb, 4).tolist()},
        "reference_perplexity": {d: reference[d]["perplexity"] for d in (a, b)},
        "planner_config": cfg.model_dump(),
        "anchors": anchors,
        "steps": steps,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot_domain_shift(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
