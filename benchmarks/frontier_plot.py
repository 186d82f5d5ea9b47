"""PNG plots of benchmarks/frontier.py and benchmarks/domain_shift.py results
(matplotlib, the "bench" optional dependency; Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1 << 20
STYLE = {
    "planner": dict(color="tab:red", marker="o", label="planner (sensitivity + routing + demand)"),
    "planner_no_sensitivity": dict(color="tab:orange", marker="s", ls="--", label="planner, no sensitivity"),
    "planner_no_routing": dict(color="tab:purple", marker="^", ls="--", label="planner, no routing"),
    "static": dict(color="tab:gray", ls=":", drawstyle="steps-post", label="best static uniform that fits"),
}


def plot_frontier(result: dict, path: Path) -> None:
    workloads = result["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.2 * len(workloads), 8), squeeze=False)
    uniform = {int(b): v for b, v in result["uniform_bytes"].items()}
    for col, (name, w) in enumerate(workloads.items()):
        x = [p["bytes"] / MIB for p in w["points"]]
        for row, metric in enumerate(("kl", "perplexity")):
            ax = axes[row][col]
            for method, style in STYLE.items():
                y = [p["methods"][method]["mean"][metric] for p in w["points"]]
                ax.plot(x, [v if v > 0 else float("nan") for v in y], **style)  # KL 0 (all 8-bit) is off a log axis
            exact = [p for p in w["points"] if p["bytes"] in uniform.values()]
            ax.scatter([p["bytes"] / MIB for p in exact], [p["methods"]["static"]["mean"][metric] for p in exact],
                       color="black", zorder=5, s=18, label="uniform 2/3/4/6/8 bits")
            if metric == "kl":
                ax.set_yscale("log")
            ax.set_xlabel("expert bytes budget (MiB)")
            ax.set_ylabel("mean KL(8-bit || method), nats/token" if metric == "kl" else "perplexity")
            ax.set_title(f"{name}: {', '.join(w['eval_domains'])} ({result['eval']['split']} split)", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"pw-moe-tiny quality-memory frontier ({result['date_utc']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_domain_shift(result: dict, path: Path) -> None:
    steps = result["steps"]
    t = [s["time_s"] for s in steps]
    a, b = result["domain_a"], result["domain_b"]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(t, [s["mean_bits_top_a"] for s in steps], color="tab:blue", label=f"{a}'s top experts")
    axes[0].plot(t, [s["mean_bits_top_b"] for s in steps], color="tab:green", label=f"{b}'s top experts")
    axes[0].set_ylabel("mean bits")
    evals = [s for s in steps if "quality" in s]
    te = [s["time_s"] for s in evals]
    ref = result["reference_perplexity"]
    for domain, color in ((a, "tab:blue"), (b, "tab:green")):
        axes[1].plot(te, [s["quality"][domain]["kl"] for s in evals], marker="o", color=color, label=domain)
        axes[1].axhline(result["anchors"]["uniform"]["quality"][domain]["kl"], color=color, ls=":", lw=1)
        axes[1].axhline(result["anchors"][f"steady_{domain}"]["quality"][domain]["kl"], color=color, ls="-.", lw=1)
        axes[2].plot(te, [100 * (s["quality"][domain]["perplexity"] / ref[domain] - 1) for s in evals],
                     marker="o", color=color, label=domain)
    axes[1].set_ylabel("KL(8-bit || plan), test subset\n(dotted: uniform; dash-dot: steady plan)", fontsize=8)
    axes[2].set_ylabel("perplexity over 8-bit (%)")
    axes[2].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.axvline(result["switch_time_s"], color="black", ls="--", lw=1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"domain shift {a} -> {b} at a fixed budget ({result['budget_label']}); "
                 f"half-life {result['half_life_s']} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
