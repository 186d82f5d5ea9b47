"""Quality-memory frontier of the precision policy on the default model (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/frontier.py

For expert byte budgets from the all-2-bit footprint to the all-8-bit one
(the uniform views' exact bytes plus points between them), each method's
per-block bits are loaded into a WeightStore (benchmarks/quality_eval.py)
and the model is evaluated on the held-out TEST split, per domain: perplexity
and mean KL(p_8bit || p) per token. Methods (benchmarks/policy_bits.py):

* static: uniform bitwidths; "best static" at a budget = the highest uniform
  view whose bytes fit it;
* planner: controlplane.planner with the profiled sensitivity table
  (models/pw-moe-tiny/sensitivity.json), routing activity and demand measured
  on the workload's VALIDATION windows (never the test split), default
  PlannerConfig (importance exponent, uniform guard); each point records the
  ladder's budget_anchor ("greedy" or "uniform-<b>") and predicted cost;
* planner_no_sensitivity: the controlplane's fallback table instead;
* planner_no_routing: uniform activity (no telemetry yet).

With --floor-bits 0 the planner may leave blocks host-only (its last rung,
priced by expected read stalls: expected_fetch_s_per_token; a budget state
holding any may also pay a per-step overhead, --host-only-step-overhead-s,
0 by default). The MoE kernels read such a block in place from pinned host
memory at its master view for each use (dataplane/weights/store.py): its
quality is the 8-bit view's, it holds no arena pages, and the price is the
stall. --budget-labels runs a subset of the
budgets.

Workloads: "mix" (all domains; activity from all of them, every domain
evaluated) and single-domain ones (activity and evaluation on that domain).
Identical bits configurations are evaluated once. Writes JSON and a PNG.

When every domain also runs as a single-domain workload, "per_domain_plans"
pools them: the mix served by a server whose plan follows the running
requests' domain (each domain evaluated under the plan made from its own
routing), against uniform 3-bit on the same domains. It is the bound of
demand-driven re-planning when a batch holds one domain; "mix" is the other
end, one plan for the mixture's average routing.
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
from benchmarks.policy_bits import (  # noqa: E402
    best_static,
    no_sensitivity_table,
    planner_plan,
    uniform_activity,
    uniform_bits,
    uniform_bytes,
    workload_activity,
)
from benchmarks.quality_eval import PAGE_BYTES, PagedModel, evaluate, load_domain_windows, mean_quality, routing_over  # noqa: E402
from controlplane.config import ControlplaneConfig, PlannerConfig  # noqa: E402
from controlplane.sensitivity import SENSITIVITY_FILE, load  # noqa: E402
from dataplane.profiling.corpus import corpus_domains  # noqa: E402
from dataplane.profiling.sensitivity import PROFILE_SIDECAR  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Points between consecutive uniform views, as fractions of the step in bytes.
BETWEEN = {(2, 3): (0.5,), (3, 4): (1 / 3, 2 / 3), (4, 6): (1 / 3, 2 / 3), (6, 8): (0.5,)}
METHODS = ("static", "planner", "planner_no_sensitivity", "planner_no_routing")
HALF_LIFE_S = ControlplaneConfig.model_fields["activity_half_life_s"].default


def expected_fetch_s_per_token(shape, bits: np.ndarray, routed: np.ndarray, cfg: PlannerConfig) -> float:
    """Seconds of on-demand fetches a token waits for under ``bits`` [L, E, 3]:
    each host-only block, fetched at the ceiling view, times the chance that
    a token routes to its expert (routed [L, E] tokens routed / tokens seen;
    the planner's RungCost at batch 1, PlannerConfig's latency and bandwidth)."""
    tokens = routed.sum(axis=1, keepdims=True) / shape.top_k  # [L, 1]
    route_prob = routed / np.maximum(tokens, 1)  # [L, E]
    fetch_s = np.asarray([cfg.host_read_latency_s + shape.footprint_bytes[p][shape.ceiling_bits]
                          / cfg.host_bandwidth_bytes_per_s for p in range(bits.shape[2])])  # [3]
    return float(((bits == 0) * route_prob[:, :, None] * fetch_s).sum())


def budgets(shape) -> list[dict]:
    """Budget points, ascending: every uniform view's exact bytes and BETWEEN."""
    points = [{"bytes": uniform_bytes(shape, b), "label": f"uniform {b}-bit"} for b in shape.view_bits]
    for (lo, hi), fracs in BETWEEN.items():
        a, b = uniform_bytes(shape, lo), uniform_bytes(shape, hi)
        points += [{"bytes": int(a + f * (b - a)), "label": f"{lo}-{hi} bit, {f:.2f}"} for f in fracs]
    top = uniform_bytes(shape, shape.ceiling_bits)
    for p in points:
        p["fraction_of_8bit"] = round(p["bytes"] / top, 4)
    return sorted(points, key=lambda p: p["bytes"])


def method_bits(shape, table, fallback, activity, budget: int, cfg: PlannerConfig) -> tuple[dict, dict]:
    """({method: bits [L, E, 3]}, {method: the planner's budget anchor and predicted cost})."""
    plans = {
        "planner": planner_plan(shape, table, activity, budget, cfg),
        "planner_no_sensitivity": planner_plan(shape, fallback, activity, budget, cfg),
        "planner_no_routing": planner_plan(shape, table, uniform_activity(shape), budget, cfg),
    }
    bits = {"static": uniform_bits(shape, best_static(shape, budget)), **{m: b for m, (b, _) in plans.items()}}
    info = {m: {"budget_anchor": ladder.budget_anchor,
                "predicted_cost": float(f"{ladder.predicted_budget_cost:.6g}")} for m, (_, ladder) in plans.items()}
    return bits, info


def describe_bits(shape, bits: np.ndarray, routed: np.ndarray, cfg: PlannerConfig) -> dict:
    values, counts = np.unique(bits, return_counts=True)
    return {"expert_bytes": shape.expert_bytes(bits), "mean_bits": round(float(bits.mean()), 4),
            "expected_fetch_s_per_token": float(f"{expected_fetch_s_per_token(shape, bits, routed, cfg):.4g}"),
            "host_only_blocks": int((bits == 0).sum()),
            "bits": bits.reshape(-1).tolist(),  # [L * E * 3] in block order (benchmarks/host_only_cost.py reads it)
            "bits_histogram": {str(int(v)): int(c) for v, c in zip(values, counts)},
            "mean_bits_per_layer": [round(float(x), 3) for x in bits.mean(axis=(1, 2))]}


def run_workload(paged: PagedModel, name: str, domains: list[str], args, table, fallback,
                 cfg: PlannerConfig) -> dict:
    start = time.perf_counter()
    shape = paged.shape
    calib = load_domain_windows(args.tokens_dir, domains, args.activity_split, args.seq_len, args.activity_windows)
    routed, mass = routing_over(paged, calib)
    activity = workload_activity(routed, mass, HALF_LIFE_S)
    points = [p for p in budgets(shape) if args.budget_labels is None or p["label"] in args.budget_labels]
    configs: dict[str, np.ndarray] = {}  # unique bits -> key
    keys: list[dict[str, str]] = []
    infos: list[dict] = []
    for p in points:
        row = {}
        bits_by_method, info = method_bits(shape, table, fallback, activity, p["bytes"], cfg)
        for method, bits in bits_by_method.items():
            key = bits.tobytes().hex()
            configs.setdefault(key, bits)
            row[method] = key
        keys.append(row)
        infos.append(info)
    tests = load_domain_windows(args.tokens_dir, domains, args.eval_split, args.seq_len, args.windows)
    print(f"[{name}] {len(configs)} unique configurations x {len(domains)} domains", flush=True)
    done = [0]

    def progress(config: str, domain: str, q) -> None:
        done[0] += 1
        print(f"[{name}] {done[0]}/{len(configs) * len(domains)} {domain}: kl={q.kl:.5f} ppl={q.perplexity:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)

    quality = evaluate(paged, tests, configs, on_done=progress)
    out_points = []
    for p, row, info in zip(points, keys, infos):
        methods = {}
        for method, key in row.items():
            per = quality[key]
            methods[method] = {**describe_bits(shape, configs[key], routed, cfg), **info.get(method, {}),
                               "per_domain": {d: q.as_dict() for d, q in per.items()},
                               "mean": mean_quality(per)}
        out_points.append({**p, "best_static_bits": best_static(shape, p["bytes"]), "methods": methods})
    return {
        "eval_domains": domains,
        "eval_tokens_per_domain": {d: w.counted for d, w in tests.items()},
        "activity": {"split": args.activity_split, "windows_per_domain": args.activity_windows,
                     "routed_share": np.round(routed / routed.sum(1, keepdims=True), 4).tolist()},
        "points": out_points,
        "checks": checks(shape, out_points),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def checks(shape, points: list[dict]) -> dict:
    """The issue's targets on this workload (mean over its domains)."""
    worse = [{"budget_bytes": p["bytes"], "metric": metric, "planner": p["methods"]["planner"]["mean"][metric],
              "best_static": p["methods"]["static"]["mean"][metric]}
             for p in points for metric in ("kl", "perplexity")
             if p["methods"]["planner"]["mean"][metric] > p["methods"]["static"]["mean"][metric]]
    u3 = next(p for p in points if p["bytes"] == uniform_bytes(shape, 3))
    base = u3["methods"]["static"]
    reduction = {m: {"mean": round(1 - u3["methods"][m]["mean"]["kl"] / base["mean"]["kl"], 4),
                     "per_domain": {d: round(1 - q["kl"] / base["per_domain"][d]["kl"], 4)
                                    for d, q in u3["methods"][m]["per_domain"].items()}}
                 for m in METHODS if m != "static"}
    return {
        "planner_at_least_best_static_kl_every_budget": not any(w["metric"] == "kl" for w in worse),
        "planner_at_least_best_static_ppl_every_budget": not any(w["metric"] == "perplexity" for w in worse),
        "planner_worse_than_best_static": worse,
        "kl_reduction_vs_uniform3_at_uniform3_budget": reduction,
        "target_40pct_kl_reduction_met": reduction["planner"]["mean"] >= 0.40,
    }


def per_domain_plans(workloads: dict, domains: list[str], uniform3_bytes: int) -> dict | None:
    """KL at the uniform-3 budget pooled over the single-domain workloads of
    ``domains`` (the corpus's; None unless each ran).

    Reduction = 1 - sum_d KL_method(d) / sum_d KL_uniform3(d): the same pooling as
    the mix workload's mean (equal weight per domain).
    """
    singles = {n: w for n, w in workloads.items() if n in domains and w["eval_domains"] == [n]}
    if not domains or len(singles) < len(domains):
        return None
    at_u3 = {d: next(p for p in singles[d]["points"] if p["bytes"] == uniform3_bytes)["methods"] for d in domains}
    base = sum(at_u3[d]["static"]["per_domain"][d]["kl"] for d in domains)
    out = {"domains": domains, "uniform3_kl_sum": float(f"{base:.6g}")}
    for method in METHODS:
        if method == "static":
            continue
        total = sum(at_u3[d][method]["per_domain"][d]["kl"] for d in domains)
        out[method] = {"kl_reduction_vs_uniform3": round(1 - total / base, 4),
                       "per_domain_kl": {d: at_u3[d][method]["per_domain"][d]["kl"] for d in domains}}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--windows", type=int, default=64, help="test windows per domain")
    parser.add_argument("--activity-windows", type=int, default=16, help="validation windows per domain")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eval-split", default="test")
    parser.add_argument("--activity-split", default="validation")
    parser.add_argument("--single-domains", default="python,german", help="comma list ('' for none)")
    parser.add_argument("--no-mix", action="store_true")
    parser.add_argument("--floor-bits", type=int, default=PlannerConfig().default_floor_bits,
                        help="the planner's default_floor_bits (0: host-only is its last rung)")
    parser.add_argument("--host-stall-weight", type=float, default=PlannerConfig().host_stall_weight,
                        help="the planner's host_stall_weight (the price of a host-only block's read stalls)")
    parser.add_argument("--reference-step-s", type=float, default=PlannerConfig().reference_step_s,
                        help="the planner's reference_step_s (the step a host-only block's stall is priced against)")
    parser.add_argument("--host-only-step-overhead-s", type=float,
                        default=PlannerConfig().host_only_step_overhead_s,
                        help="the planner's host_only_step_overhead_s (a per-step cost of any block on the host)")
    parser.add_argument("--host-price-batch", type=int, default=1,
                        help="the planner's host_price_batch (the decode batch host reads are priced at; the "
                             "workload's demand here is its whole token mass, not a running batch)")
    parser.add_argument("--host-read-latency-s", type=float, default=PlannerConfig().host_read_latency_s,
                        help="the planner's host_read_latency_s (fixed cost of one read of a host-only block)")
    parser.add_argument("--budget-labels", help="';'-separated budget labels to run (e.g. 'uniform 3-bit'; "
                                                "default every budget; uniform 3-bit is always run)")
    parser.add_argument("--out", type=Path, default=RESULTS / "frontier_cpu.json")
    args = parser.parse_args(argv)
    if args.budget_labels is not None:
        args.budget_labels = {"uniform 3-bit", *args.budget_labels.split(";")}
    if args.eval_split == args.activity_split:
        raise SystemExit("the activity workload must not come from the evaluated split")
    start = time.perf_counter()
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, args.batch)
    table = load(args.model / SENSITIVITY_FILE)
    fallback = no_sensitivity_table(paged.shape)
    cfg = PlannerConfig(default_floor_bits=args.floor_bits, host_stall_weight=args.host_stall_weight,
                        reference_step_s=args.reference_step_s, host_read_latency_s=args.host_read_latency_s,
                        host_price_batch=args.host_price_batch,
                        host_only_step_overhead_s=args.host_only_step_overhead_s)
    domains = corpus_domains(args.tokens_dir)
    workloads = {} if args.no_mix else {"mix": domains}
    workloads.update({d: [d] for d in filter(None, args.single_domains.split(","))})
    if not workloads:
        raise SystemExit("no workload to run (--no-mix and no --single-domains)")
    sidecar = args.model / PROFILE_SIDECAR
    result = {
        "benchmark": "quality-memory frontier",
        **cpu_header("benchmarks/frontier.py", argv),
        "model": str(args.model),
        "sensitivity": {"file": str(args.model / SENSITIVITY_FILE),
                        "profile": json.loads(sidecar.read_text())["calibration"] if sidecar.is_file() else None},
        "planner_config": cfg.model_dump(),
        "activity_half_life_s": HALF_LIFE_S,
        "page_bytes": PAGE_BYTES,
        "seq_len": args.seq_len,
        "eval": {"split": args.eval_split, "windows_per_domain": args.windows,
                 "subset": "windows spread evenly over the split (dataplane/profiling/corpus.py)",
                 "kl": "mean KL(p_8bit || p) per counted position, nats; reference = every block at the 8-bit view"},
        "uniform_bytes": {str(b): uniform_bytes(paged.shape, b) for b in paged.shape.view_bits},
        "workloads": {},
    }
    for name, doms in workloads.items():
        result["workloads"][name] = run_workload(paged, name, doms, args, table, fallback, cfg)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # partial results survive an interrupt
    pooled = per_domain_plans(result["workloads"], domains, uniform_bytes(paged.shape, 3))
    if pooled is not None:
        result["per_domain_plans"] = pooled
    result["wall_s"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    from benchmarks.frontier_plot import plot_frontier  # matplotlib: the benchmark extra, not the tests'

    plot_frontier(result, args.out.with_suffix(".png"))
    for name, w in result["workloads"].items():
        c = w["checks"]
        print(f"{name}: KL reduction at uniform-3 budget {c['kl_reduction_vs_uniform3_at_uniform3_budget']['planner']}"
              f"; >= best static (KL) at every budget: {c['planner_at_least_best_static_kl_every_budget']}")
    if pooled is not None:
        print(f"each domain under its own plan ({', '.join(pooled['domains'])}): KL reduction at uniform-3 budget "
              f"{pooled['planner']['kl_reduction_vs_uniform3']}")


if __name__ == "__main__":
    main()
