"""Where a MoE layer's time goes across bitwidths: a line through a layer
table's uniform rows (CPU, instant; reads a bench_moe.py JSON, writes
nothing).

    .venv/bin/python benchmarks/layer_bytes_fit.py benchmarks/results/s63_tables_h100.json

For each (model, batch), the uniform bitwidths' rows (8 / 6 / 4 / 3 / 2
bits: the same experts, tokens and tiles, only the bytes differ) are fitted
by least squares as

    time_us = fixed_us + bytes / marginal_bandwidth

marginal_bandwidth says how fast the extra bytes of a wider bitwidth cost;
fixed_us what the layer would take at zero bytes: its bit-independent work
(the token tiles' products, addressing, launches and their latency chains),
as far as it does not hide under the streaming. Where the marginal bandwidth
is at or above the copy's, the bytes themselves stream at the copy's speed
and the layer's shortfall against the copy is fixed_us; it is then the
bound on what a kernel change that only moves bytes (fewer or faster) can
win. The line is a fit, not a measurement: where fixed work and streaming
overlap only in part the two terms mix, so a fit with a large residual
says little, and a marginal bandwidth well above the copy's says that part
of the fixed work hides under the wider bitwidths' streaming (the line then
overstates the fixed work at 8 bits and understates it at 2). So beside the
fit, each bitwidth's excess over the copy is printed: time_us - bytes /
copy bandwidth, the layer's own shortfall, no fit involved.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

UNIFORM_BITS = ("8", "6", "4", "3", "2")
# unit sizes: the fit runs in MB and us, bandwidths print in GB/s
_MB = 1e6
_US_PER_S = 1e6
_GB = 1e9


@dataclass(frozen=True)
class LayerFit:
    """The line through one (model, batch)'s uniform rows."""

    model: str
    batch: int
    points: int
    fixed_us: float
    marginal_GBps: float
    max_residual_us: float
    copy_GBps: float | None
    excess_us: dict[str, float]  # bits -> time_us - bytes / copy (empty without a copy)

    @property
    def marginal_vs_copy(self) -> float | None:
        """The marginal bandwidth over the copy's (None without a copy)."""
        return self.marginal_GBps / self.copy_GBps if self.copy_GBps else None


def row_bytes(row: dict) -> int:
    """The bytes a bench_moe row must move, as its pct_hbm counts them: the
    weights' and the activations' (act_bytes; 0 where a row lacks it)."""
    return row["weight_bytes"] + row.get("act_bytes", 0)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys); needs
    two distinct xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct byte counts")
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def fit_layers(table: dict) -> list[LayerFit]:
    """One LayerFit per (model, batch) of the table's uniform rows with at
    least two bitwidths. table: bench_moe.py's JSON (its 'moe' rows), or a
    results file holding it under 'layer'."""
    layer = table.get("layer", table)
    if "moe" not in layer:
        raise ValueError("not a bench_moe.py table: no 'moe' rows")
    copy = layer.get("copy_GBps")
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in layer["moe"]:
        if row.get("bits") in UNIFORM_BITS and "time_us" in row and "batch" in row:
            groups.setdefault((row["model"], row["batch"]), []).append(row)
    fits = []
    for (model, batch), rows in groups.items():
        if len({row_bytes(r) for r in rows}) < 2:
            continue
        xs = [row_bytes(r) / _MB for r in rows]
        ys = [r["time_us"] for r in rows]
        fixed, us_per_mb = fit_line(xs, ys)
        residual = max(abs(y - (fixed + us_per_mb * x)) for x, y in zip(xs, ys))
        marginal = (_MB / _GB) / (us_per_mb / _US_PER_S) if us_per_mb > 0 else float("inf")
        excess = {r["bits"]: r["time_us"] - row_bytes(r) / (copy * _GB) * _US_PER_S for r in rows} if copy else {}
        fits.append(LayerFit(model, batch, len(rows), fixed, marginal, residual, copy, excess))
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path, help="bench_moe.py JSON, or a results file with it under 'layer'")
    args = parser.parse_args()
    fits = fit_layers(json.loads(args.table.read_text()))
    print("| model | B | rows | fixed us | marginal GB/s | / copy | max residual us | excess over the copy, us |")
    print("|---|---|---|---|---|---|---|---|")
    for f in fits:
        ratio = f"{f.marginal_vs_copy:.2f}" if f.marginal_vs_copy is not None else "-"
        excess = ", ".join(f"{bits}: {us:.1f}" for bits, us in f.excess_us.items()) or "-"
        print(f"| {f.model} | {f.batch} | {f.points} | {f.fixed_us:.1f} | {f.marginal_GBps:.0f} | {ratio} "
              f"| {f.max_residual_us:.1f} | {excess} |")


if __name__ == "__main__":
    main()
