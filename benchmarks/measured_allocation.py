"""Bit allocation from MEASURED per-block costs at the uniform 3-bit budget
(CPU, ~30 min): would a better sensitivity estimate reach the issue's
"40 % lower KL than uniform 3-bit"?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/measured_allocation.py

benchmarks/allocation_bound.py bounds what any allocation can gain by the
sensitivity table's own prediction. This script replaces the table by
measurement. For each workload:

1. probe (validation split, a few windows per domain): from every block at
   3 bits, move ONE block to each other view and measure the change of the
   mean KL to the 8-bit model: c[block, view] (additive model of the cost);
2. allocate: the Lagrangian choice per block argmin_v c + lam * bytes, at
   the smallest lam whose allocation fits the uniform 3-bit bytes;
3. measure that allocation and uniform 3-bit on the TEST split (the
   frontier's windows): the reduction it reaches, against the planner's in
   benchmarks/results/frontier_cpu.json.

The probe's costs are fitted to its windows (an oracle on validation, not a
deployable policy). Writes JSON.
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

from benchmarks.allocation_bound import LAMBDAS, view_bytes  # noqa: E402
from benchmarks.policy_bits import uniform_bits, uniform_bytes  # noqa: E402
from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.quality_eval import PagedModel, evaluate, load_domain_windows, mean_quality  # noqa: E402
from benchmarks.quality_eval import current_quality, reference_log_probs  # noqa: E402
from dataplane.profiling.corpus import corpus_domains  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE_BITS = 3


def probe_costs(paged: PagedModel, windows: dict, views: list[int]) -> tuple[np.ndarray, float]:
    """(c [L, E, 3, V]: change of the domain-mean KL when one block moves from
    BASE_BITS to view V, the rest at BASE_BITS; the base KL)."""
    base = uniform_bits(paged.shape, BASE_BITS)
    refs = {d: reference_log_probs(paged, w) for d, w in windows.items()}

    def mean_kl(bits: np.ndarray) -> float:
        paged.set_bits(bits)
        return float(np.mean([current_quality(paged, w, refs[d]).kl for d, w in windows.items()]))

    base_kl = mean_kl(base)
    cost = np.zeros((*base.shape, len(views)))
    started = time.perf_counter()
    blocks = list(np.ndindex(*base.shape))
    for n, idx in enumerate(blocks):
        for j, v in enumerate(views):
            if v == BASE_BITS:
                continue
            bits = base.copy()
            bits[idx] = v
            cost[idx + (j,)] = mean_kl(bits) - base_kl
        if n % 16 == 15:
            print(f"  probed {n + 1}/{len(blocks)} blocks, {time.perf_counter() - started:.0f} s", flush=True)
    return cost, base_kl


def allocate(cost: np.ndarray, nbytes: np.ndarray, views: list[int], budget: int) -> tuple[np.ndarray, float]:
    """(bits [L, E, 3], predicted cost) of the Lagrangian allocation at the
    smallest multiplier whose bytes fit ``budget``. cost, nbytes: [L, E, 3, V]."""
    flat_c, flat_b = cost.reshape(-1, len(views)), nbytes.reshape(-1, len(views))
    for lam in LAMBDAS:
        pick = (flat_c + lam * flat_b).argmin(axis=1)
        rows = np.arange(len(pick))
        if flat_b[rows, pick].sum() <= budget:
            bits = np.asarray(views)[pick].reshape(cost.shape[:-1])
            return bits, float(flat_c[rows, pick].sum())
    raise RuntimeError("no multiplier fits the budget")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--probe-windows", type=int, default=8, help="validation windows per domain (single domain)")
    parser.add_argument("--probe-windows-mix", type=int, default=4, help="validation windows per domain (mix)")
    parser.add_argument("--test-windows", type=int, default=64, help="test windows per domain (as the frontier)")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--workloads", default="python,mix", help="comma list: domains or 'mix'")
    parser.add_argument("--frontier", type=Path, default=RESULTS / "frontier_cpu.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "measured_allocation_cpu.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, 8)
    shape = paged.shape
    views = list(shape.view_bits)
    nbytes = np.broadcast_to(view_bytes(shape), (shape.num_layers, shape.num_experts, 3, len(views)))
    budget = uniform_bytes(shape, BASE_BITS)
    frontier = json.loads(args.frontier.read_text()) if args.frontier.exists() else None
    domains = corpus_domains(args.tokens_dir)
    result = {"benchmark": "allocation from measured per-block costs at the uniform 3-bit budget",
              **cpu_header("benchmarks/measured_allocation.py", argv), "model": str(args.model),
              "budget_bytes": budget, "views": views, "workloads": {}}
    for name in filter(None, args.workloads.split(",")):
        doms = domains if name == "mix" else [name]
        probe_n = args.probe_windows_mix if name == "mix" else args.probe_windows
        started = time.perf_counter()
        probe = load_domain_windows(args.tokens_dir, doms, "validation", args.seq_len, probe_n)
        cost, base_kl = probe_costs(paged, probe, views)
        bits, predicted = allocate(cost, nbytes, views, budget)
        test = load_domain_windows(args.tokens_dir, doms, "test", args.seq_len, args.test_windows)
        measured = evaluate(paged, test, {"uniform": uniform_bits(shape, BASE_BITS), "measured_oracle": bits})
        uni, orc = mean_quality(measured["uniform"])["kl"], mean_quality(measured["measured_oracle"])["kl"]
        row = {
            "probe": {"split": "validation", "windows_per_domain": probe_n, "domains": doms, "base_kl": base_kl},
            "predicted_reduction": -predicted / base_kl,
            "oracle_bytes": int(shape.expert_bytes(bits)),
            "oracle_bits_histogram": {str(v): int((bits == v).sum()) for v in views if (bits == v).any()},
            "test": {"windows_per_domain": args.test_windows, "uniform_kl": uni, "oracle_kl": orc,
                     "measured_reduction": 1.0 - orc / uni,
                     "per_domain": {c: {d: q.as_dict() for d, q in per.items()} for c, per in measured.items()}},
            "single_block_costs": {"note": "c[layer][expert][proj][view]: KL change, one block moved from 3 bits",
                                   "values": np.round(cost, 7).tolist()},
            "wall_s": round(time.perf_counter() - started, 1),
        }
        if frontier is not None and name in frontier["workloads"]:
            point = next(p for p in frontier["workloads"][name]["points"] if p["label"] == f"uniform {BASE_BITS}-bit")
            planner = point["methods"]["planner"]["mean"]["kl"]
            row["planner_frontier"] = {"kl": planner, "reduction": 1.0 - planner / point["methods"]["static"]["mean"]["kl"]}
        result["workloads"][name] = row
        print(f"{name}: probe base KL {base_kl:.5f}; oracle predicted -{row['predicted_reduction']:.1%}; test: uniform "
              f"{uni:.5f} oracle {orc:.5f} -> {row['test']['measured_reduction']:.1%} lower "
              f"(planner {row.get('planner_frontier', {}).get('reduction', float('nan')):.1%}); "
              f"bits {row['oracle_bits_histogram']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
