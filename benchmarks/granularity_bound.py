"""Would finer blocks let bit allocation reach "40 % lower KL than uniform
3-bit"? The table-predicted bound of benchmarks/allocation_bound.py with each
block (one projection of one expert) cut into row chunks (CPU, ~2 min).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/granularity_bound.py

Today a block is the unit of precision (docs/WEIGHT_LAYOUT.md). Here every
block's table cost at each view (sensitivity.json, KL units) is shared among
its row chunks in proportion to their raw errors: the profiler's per-row
terms R_f (dW S dW^T)_ff (dataplane/profiling/sensitivity.py), recomputed
from calibration moments of the TRAIN split. A chunk's bytes are its share
of rows. The Lagrangian dual bound over chunks then caps what an allocation
at that granularity could gain at the uniform 3-bit budget, by the same
table (same importance weights as allocation_bound.py). rows=N is the
block-level bound (the baseline); 128 rows is the fused kernel's row tile.
Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.allocation_bound import (  # noqa: E402
    HALF_LIFE_S,
    dual_bound,
    frontier_workloads,
    view_bytes,
    weighted_view_costs,
)
from benchmarks.policy_bits import uniform_bytes, workload_activity  # noqa: E402
from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.quality_eval import PagedModel, load_domain_windows, routing_over  # noqa: E402
from controlplane.config import PlannerConfig  # noqa: E402
from controlplane.sensitivity import SENSITIVITY_FILE, load  # noqa: E402
from dataplane.profiling.corpus import corpus_domains, split_windows  # noqa: E402
from dataplane.profiling.sensitivity import (  # noqa: E402
    block_weighting,
    collect_moments,
    expert_stats,
    load_model,
    quadratic_cost_rows,
    view_deltas,
)
from dataplane.profiling.window_forward import WindowForward  # noqa: E402
from dataplane.weights.layout import PROJ_DOWN, PROJ_GATE, PROJ_UP, VIEW_BITS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE_BITS = 3


def row_errors(model_path: Path, tokens_dir: Path, tokens: int, seq_len: int, batch: int) -> list:
    """Per block, the raw per-row error at every view: [L][E][3] arrays [N, V]."""
    model, ckpt = load_model(model_path)
    domains = corpus_domains(tokens_dir)
    per_domain = max(1, tokens // (len(domains) * seq_len))
    windows = torch.cat([split_windows(tokens_dir, d, "train", seq_len, per_domain).inputs for d in domains])
    recorders = collect_moments(model, WindowForward(model, ckpt.spec, batch, seq_len), windows, batch, False)
    out = []
    for r in recorders:
        w1, w3, w2 = r.inner.w1.detach(), r.inner.w3.detach(), r.inner.w2.detach()
        layer = []
        for e in range(w1.shape[0]):
            stats = expert_stats(r.moments, e)
            blocks = []
            for proj, w in ((PROJ_GATE, w1[e]), (PROJ_UP, w3[e]), (PROJ_DOWN, w2[e])):
                sigma, rows = block_weighting(stats, proj, "output", w2[e])
                deltas = view_deltas(w)
                per_view = [quadratic_cost_rows(deltas[b], sigma, rows).numpy() for b in VIEW_BITS]
                blocks.append(np.stack(per_view, axis=-1))  # [N, V]
            layer.append(blocks)
        out.append(layer)
    return out


def chunk_tables(block_cost: np.ndarray, errors: list, rows_per_chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(cost [n_chunks, V], row share [n_chunks]) for all blocks: each block's
    table cost at a view split by its chunks' shares of the raw error above
    the 8-bit view (an even split where the block's error is 0)."""
    costs, shares = [], []
    for idx in np.ndindex(*block_cost.shape[:-1]):
        err = errors[idx[0]][idx[1]][idx[2]]  # [N, V]
        n = err.shape[0]
        rel = np.clip(err - err[:, -1:], 0.0, None)  # [N, V] above the 8-bit view
        size = min(rows_per_chunk, n)
        for start in range(0, n, size):
            part = rel[start:start + size].sum(axis=0)  # [V]
            total = rel.sum(axis=0)
            frac = np.where(total > 0, part / np.where(total > 0, total, 1.0), (min(start + size, n) - start) / n)
            costs.append(block_cost[idx] * frac)
            shares.append((min(start + size, n) - start) / n)
    return np.asarray(costs), np.asarray(shares)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--tokens", type=int, default=65536, help="calibration tokens (train split), as the profiler")
    parser.add_argument("--activity-windows", type=int, default=16, help="validation windows per domain")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--chunks", default="0,128,64,16,1", help="rows per chunk (0 = whole block)")
    parser.add_argument("--single-domains", default="python,german")
    parser.add_argument("--out", type=Path, default=RESULTS / "granularity_bound_cpu.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    paged = PagedModel(args.model, args.seq_len, 8)
    shape, table, cfg = paged.shape, load(args.model / SENSITIVITY_FILE), PlannerConfig()
    views = list(shape.view_bits)
    budget = uniform_bytes(shape, BASE_BITS)
    errors = row_errors(args.model, args.tokens_dir, args.tokens, args.seq_len, 8)
    block_bytes = view_bytes(shape)  # [3, V]
    workloads = frontier_workloads(args.tokens_dir, args.single_domains)
    result = {"benchmark": "table-predicted allocation bound by block granularity (uniform 3-bit budget)",
              **cpu_header("benchmarks/granularity_bound.py", argv), "model": str(args.model),
              "budget_bytes": budget, "workloads": {}}
    for name, doms in workloads.items():
        windows = load_domain_windows(args.tokens_dir, doms, "validation", args.seq_len, args.activity_windows)
        activity = workload_activity(*routing_over(paged, windows), HALF_LIFE_S)
        per_view = weighted_view_costs(shape, table, activity, budget, cfg)[1]  # [L, E, 3, V]
        uniform = float(per_view[..., views.index(BASE_BITS)].sum())
        rows = []
        for rows_per_chunk in (int(c) for c in args.chunks.split(",")):
            size = rows_per_chunk or 1 << 30
            chunk_cost, share = chunk_tables(per_view, errors, size)
            proj_of = np.concatenate([np.full(len(range(0, errors[l][e][p].shape[0], min(size, errors[l][e][p].shape[0]))), p)
                                      for l, e, p in np.ndindex(*per_view.shape[:-1])])
            chunk_bytes = block_bytes[proj_of] * share[:, None]  # [n_chunks, V]
            bound = dual_bound(chunk_cost, chunk_bytes, budget)
            row = {"rows_per_chunk": rows_per_chunk or "block", "chunks": int(len(share)),
                   "any_allocation_at_least": bound, "max_predicted_reduction": 1.0 - bound / uniform}
            rows.append(row)
            print(f"{name:7s} rows/chunk {row['rows_per_chunk']!s:>5}: {row['chunks']:6d} units, "
                  f"at most {row['max_predicted_reduction']:.1%} lower than uniform {BASE_BITS}-bit", flush=True)
        result["workloads"][name] = {"uniform_predicted": uniform, "bounds": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
