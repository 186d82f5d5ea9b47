"""Would an activation-weighted (scale, offset) fit lower the KL of the low
views? (CPU, ~3 min; an experiment on the codec, not the served path.)

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/codec_weighted_fit.py

The codec (dataplane/weights/codec.py) fits each view's (scale, offset) per
(row, group of 128) by plain least squares to the weights, with the codes
fixed (the b-bit code is the top b bits of the 8-bit code: the nesting that
lets a block drop bits in place). Here the same fit is weighted by the
block's input second moments per column, diag(S) of the profiler
(dataplane/profiling/sensitivity.py: E[g^2 x x^T] for gate/up, E[g^2 h h^T]
for down, from TRAIN windows), i.e. it minimises the error of the block's
output instead of its weights. Codes, layout and bytes stay the same.

A third fit uses the full S: every (scale, offset) of a row jointly, so the
input correlations within and across groups count. Every expert of the
model is put at one view (2, 3 or 4 bits) with each fit, and the mean KL to
the 8-bit view is measured on TEST windows of every domain. Then, per
workload, the planner's state at the uniform 3-bit budget (activity from
VALIDATION windows, as benchmarks/frontier.py) against uniform 3-bit, with
the plain and the full-S fit: does the better fit change the planner's gain?
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

from benchmarks.allocation_bound import HALF_LIFE_S  # noqa: E402
from benchmarks.policy_bits import planner_bits, uniform_bits, uniform_bytes, workload_activity  # noqa: E402
from benchmarks.provenance import cpu_header  # noqa: E402
from benchmarks.quality_eval import PagedModel, _kl_and_nll, load_domain_windows, routing_over  # noqa: E402
from controlplane.config import PlannerConfig  # noqa: E402
from controlplane.sensitivity import SENSITIVITY_FILE, load  # noqa: E402
from dataplane.profiling.corpus import corpus_domains, split_windows  # noqa: E402
from dataplane.profiling.sensitivity import collect_moments, expert_stats, load_model  # noqa: E402
from dataplane.profiling.window_forward import WindowForward  # noqa: E402
from dataplane.weights.codec import _group_min_max, decode, encode  # noqa: E402
from dataplane.weights.layout import CODE_BITS, GROUP  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FITS = ("plain_lsq", "weighted_lsq", "full_weighted_lsq")  # today's codec, diag(S)-weighted, full-S joint per row


def codes_8bit(w: torch.Tensor) -> torch.Tensor:
    """The codec's 8-bit codes of W [N, K] (min-max per group), [N, G, GROUP]."""
    n, k = w.shape
    return _group_min_max(w.float().reshape(n, k // GROUP, GROUP))[2]


def weighted_view(w: torch.Tensor, bits: int, col_weight: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """W at ``bits`` with (scale, offset) per (row, group) fitted by least
    squares weighted by col_weight [K]; plain [N, K] (the codec's view) where
    a group's fit is degenerate. Scale rounded to fp16, then the offset refit."""
    n, k = w.shape
    wg = w.double().reshape(n, k // GROUP, GROUP)
    t = (codes_8bit(w) >> (CODE_BITS - bits)).double()  # [N, G, GROUP]
    s = col_weight.double().clamp_min(0).reshape(1, k // GROUP, GROUP)
    s = s + 1e-12 * s.mean()  # every weight counts a little (columns no token reached)
    sw, st = (s * wg).sum(-1), (s * t).sum(-1)
    ss, stt, stw = s.sum(-1), (s * t * t).sum(-1), (s * t * wg).sum(-1)
    den = ss * stt - st * st
    ok = den > 1e-12 * ss * stt.clamp_min(1e-30)
    scale = torch.where(ok, (ss * stw - st * sw) / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))
    scale = scale.to(torch.float16).double()
    offset = (sw - scale * st) / ss
    out = (offset[..., None] + scale[..., None] * t).reshape(n, k)
    keep = ok[..., None].expand(n, k // GROUP, GROUP).reshape(n, k)
    return torch.where(keep, out.to(torch.float16).float(), plain.float())


def full_weighted_view(w: torch.Tensor, bits: int, sigma: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """W at ``bits`` with every (scale, offset) of a row fitted jointly to
    minimise (w - w_hat) S (w - w_hat)^T, S = sigma [K, K] (input
    correlations across groups included); scales rounded to fp16, then the
    offsets refit with the scales fixed. plain [N, K] where a row's system is
    singular."""
    n, k = w.shape
    g = k // GROUP
    t = (codes_8bit(w) >> (CODE_BITS - bits)).double()  # [N, G, GROUP]
    sig = sigma.double() + 1e-9 * torch.diagonal(sigma.double()).mean() * torch.eye(k, dtype=torch.float64)
    member = torch.zeros(g, k, dtype=torch.float64)  # [G, K] 1 where column k is in group j
    for j in range(g):
        member[j, j * GROUP:(j + 1) * GROUP] = 1.0
    offsets_basis = member.T.expand(n, k, g)  # [N, K, G]
    scales_basis = member.T[None] * t.reshape(n, k)[:, :, None]  # [N, K, G]
    basis = torch.cat([offsets_basis, scales_basis], dim=-1)  # [N, K, 2G]
    wd = w.double()
    lhs = basis.transpose(1, 2) @ sig @ basis  # [N, 2G, 2G]
    rhs = basis.transpose(1, 2) @ (sig @ wd[:, :, None])  # [N, 2G, 1]
    sol, info = torch.linalg.solve_ex(lhs, rhs)
    ok = info == 0
    scale = sol[:, g:, 0].to(torch.float16).double()  # [N, G]
    # Offsets again with the rounded scales fixed.
    resid = wd[:, :, None] - scales_basis @ scale[:, :, None]  # [N, K, 1]
    lhs_o = offsets_basis.transpose(1, 2) @ sig @ offsets_basis
    rhs_o = offsets_basis.transpose(1, 2) @ (sig @ resid)
    offset = torch.linalg.solve_ex(lhs_o, rhs_o)[0][:, :, 0]  # [N, G]
    out = (offset[:, :, None] + scale[:, :, None] * t).reshape(n, k).to(torch.float16).float()
    return torch.where(ok[:, None], out, plain.float())


def mean_kl(runner: WindowForward, windows: dict, refs: dict, batch: int) -> dict[str, float]:
    """{domain: mean KL(ref || model) per counted position} of the runner's model on ``windows``."""
    out = {}
    for d, win in windows.items():
        kl_sum = 0.0
        for i, s in enumerate(range(0, win.inputs.shape[0], batch)):
            kl_sum += _kl_and_nll(refs[d][i], runner.log_probs(win.inputs[s:s + batch]), win.targets[s:s + batch])[0]
        out[d] = kl_sum / win.counted
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--tokens", type=int, default=65536, help="calibration tokens (train split)")
    parser.add_argument("--test-windows", type=int, default=16, help="test windows per domain")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--views", default="2,3,4")
    parser.add_argument("--planner-workloads", default="mix,python,german", help="comma list ('' for none)")
    parser.add_argument("--activity-windows", type=int, default=16, help="validation windows per domain")
    parser.add_argument("--out", type=Path, default=RESULTS / "codec_weighted_fit_cpu.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    batch = 8
    model, ckpt = load_model(args.model)
    domains = corpus_domains(args.tokens_dir)
    per_domain = max(1, args.tokens // (len(domains) * args.seq_len))
    calib = torch.cat([split_windows(args.tokens_dir, d, "train", args.seq_len, per_domain).inputs for d in domains])
    runner = WindowForward(model, ckpt.spec, batch, args.seq_len)
    recorders = collect_moments(model, runner, calib, batch, progress=False)
    for r in recorders:
        r.enabled = False
    originals = [(r.inner.w1.detach().clone(), r.inner.w3.detach().clone(), r.inner.w2.detach().clone())
                 for r in recorders]
    encoded = [[(encode(w1[e]), encode(w3[e]), encode(w2[e])) for e in range(w1.shape[0])]
               for w1, w3, w2 in originals]

    cache: dict[tuple, torch.Tensor] = {}

    def block_view(layer: int, e: int, proj: int, bits: int, fit: str) -> torch.Tensor:
        key = (layer, e, proj, bits, fit)
        if key not in cache:
            stats = expert_stats(recorders[layer].moments, e)
            w = originals[layer][(0, 1, 2)[proj]][e]
            cols = stats.h_g2 if proj == 2 else stats.x_g2
            view = decode(encoded[layer][e][proj], bits)
            if fit == "weighted_lsq":
                view = weighted_view(w, bits, torch.diagonal(cols), view)
            elif fit == "full_weighted_lsq":
                view = full_weighted_view(w, bits, cols, view)
            cache[key] = view
        return cache[key]

    def set_bits(bits: np.ndarray, fit: str) -> None:
        """Every block at its bits [L, E, 3] with ``fit``."""
        with torch.no_grad():
            for layer, r in enumerate(recorders):
                for e in range(r.inner.w1.shape[0]):
                    for proj, dst in enumerate((r.inner.w1, r.inner.w3, r.inner.w2)):
                        dst[e].copy_(block_view(layer, e, proj, int(bits[layer, e, proj]), fit).to(dst.dtype))

    shape_bits = (len(recorders), recorders[0].inner.w1.shape[0], 3)

    def set_view(bits: int, fit: str) -> None:
        set_bits(np.full(shape_bits, bits), fit)

    test = {d: split_windows(args.tokens_dir, d, "test", args.seq_len, args.test_windows) for d in domains}
    set_view(8, "plain_lsq")
    refs = {d: [runner.log_probs(w.inputs[s:s + batch]) for s in range(0, w.inputs.shape[0], batch)]
            for d, w in test.items()}
    result = {"benchmark": "activation-weighted (scale, offset) fit of the low views",
              **cpu_header("benchmarks/codec_weighted_fit.py", argv), "model": str(args.model),
              "calibration": {"split": "train", "tokens": int(calib.numel())},
              "eval": {"split": "test", "windows_per_domain": args.test_windows,
                       "kl": "mean KL(p_8bit || p) per counted position, nats, every expert at the view"},
              "views": []}
    for bits in (int(b) for b in args.views.split(",")):
        row = {"bits": bits}
        for name in FITS:
            set_view(bits, name)
            per_domain_kl = mean_kl(runner, test, refs, batch)
            row[name] = {"per_domain": per_domain_kl, "mean": float(np.mean(list(per_domain_kl.values())))}
        row["kl_change_vs_plain"] = {name: row[name]["mean"] / row["plain_lsq"]["mean"] - 1.0 for name in FITS[1:]}
        result["views"].append(row)
        print(f"{bits}-bit: mean KL " + ", ".join(f"{name} {row[name]['mean']:.5f}" for name in FITS)
              + " (change vs plain: " + ", ".join(f"{v:+.1%}" for v in row["kl_change_vs_plain"].values()) + ")",
              flush=True)
    cache.clear()
    paged = PagedModel(args.model, args.seq_len, batch)
    shape = paged.shape
    budget = uniform_bytes(shape, 3)
    table, cfg = load(args.model / SENSITIVITY_FILE), PlannerConfig()
    result["planner_at_uniform3_budget"] = {}
    for name in filter(None, args.planner_workloads.split(",")):
        doms = domains if name == "mix" else [name]
        activity = workload_activity(*routing_over(paged, load_domain_windows(
            args.tokens_dir, doms, "validation", args.seq_len, args.activity_windows)), HALF_LIFE_S)
        states = {"uniform3": uniform_bits(shape, 3), "planner": planner_bits(shape, table, activity, budget, cfg)}
        wins = {d: test[d] for d in doms}
        row = {}
        for fit in ("plain_lsq", "full_weighted_lsq"):
            kls = {}
            for state, bits in states.items():
                set_bits(bits, fit)
                kls[state] = float(np.mean(list(mean_kl(runner, wins, {d: refs[d] for d in doms}, batch).values())))
            row[fit] = {**kls, "planner_reduction": 1.0 - kls["planner"] / kls["uniform3"]}
        result["planner_at_uniform3_budget"][name] = row
        print(f"{name}: " + "; ".join(f"{fit}: uniform3 {v['uniform3']:.5f} planner {v['planner']:.5f} "
                                      f"({v['planner_reduction']:.1%} lower)" for fit, v in row.items()), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
