"""Where a kernel's warp-stall samples fall, from Nsight Compute's per-SASS
source page: in the hot loops or in code every warp runs once (prologue and
epilogue), and on which instructions.

    ncu --clock-control none --set full -k regex:_moe_gate_up --launch-skip 3 \\
        --launch-count 1 -o gu python3 benchmarks/moe_ncu_probe.py --batch 1 --bits 4
    ncu --import gu.ncu-rep --page source --print-source sass --csv > gu_sass.csv
    python3 benchmarks/ncu_source_summary.py gu_sass.csv [more.csv.gz ...] [--json out.json]

Instructions are grouped by how often they executed: the group executed
once per warp (as often as the kernel's first instruction) is the code
outside every loop; the most executed group is the inner loop. A reading
aid for counter runs (ncu serialises and replays kernels), not a benchmark.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL_PREFIX = "stall_"
TOP_REASONS = 6
TOP_INSTRUCTIONS = 12


def read_source_page(path: Path) -> list[dict[str, str]]:
    """The instruction rows of one source-page CSV (plain or gzipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header_at is None:
        raise ValueError(f"{path}: no source-page header (a row starting with Address)")
    header = rows[header_at]
    return [dict(zip(header, r)) for r in rows[header_at + 1:] if len(r) == len(header)]


def _count(row: dict[str, str], key: str) -> int:
    return int(row.get(key) or 0)


def summarize(rows: list[dict[str, str]]) -> dict:
    """Samples per execution-count group with their leading stall reasons,
    and the most sampled instructions of the once-per-warp code."""
    reasons = [k for k in rows[0] if k.startswith(STALL_PREFIX) and "Not Issued" not in k]
    total = sum(_count(r, SAMPLES) for r in rows)
    if total == 0:
        raise ValueError("the report holds no warp-stall samples (run ncu with --set full)")
    once = _count(rows[0], EXECUTED)
    groups: dict[int, dict] = {}
    for r in rows:
        g = groups.setdefault(_count(r, EXECUTED), {"instructions": 0, "samples": 0,
                                                    "reasons": collections.Counter()})
        g["instructions"] += 1
        g["samples"] += _count(r, SAMPLES)
        for k in reasons:
            g["reasons"][k.removeprefix(STALL_PREFIX)] += _count(r, k)
    out_groups = []
    for executed, g in sorted(groups.items(), key=lambda kv: -kv[1]["samples"]):
        if g["samples"] == 0:
            continue
        out_groups.append({
            "executed": executed, "instructions": g["instructions"],
            "samples_pct": round(100 * g["samples"] / total, 1),
            "reasons_pct": {k: round(100 * v / g["samples"], 1) for k, v in g["reasons"].most_common(TOP_REASONS)},
        })
    once_rows = sorted((r for r in rows if _count(r, EXECUTED) == once), key=lambda r: -_count(r, SAMPLES))
    hot_once = [{"sass": r["Source"].strip(), "samples_pct": round(100 * _count(r, SAMPLES) / total, 2),
                 "reason": max(reasons, key=lambda k: _count(r, k)).removeprefix(STALL_PREFIX)}
                for r in once_rows[:TOP_INSTRUCTIONS] if _count(r, SAMPLES)]
    return {"samples": total, "executed_once_per_warp": once, "groups": out_groups,
            "once_per_warp_top": hot_once}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="also write the summaries as JSON")
    args = ap.parse_args()
    table = {}
    for path in args.reports:
        s = summarize(read_source_page(path))
        table[path.name] = s
        print(f"{path.name}: {s['samples']} samples")
        for g in s["groups"][:4]:
            why = ", ".join(f"{k} {v}%" for k, v in g["reasons_pct"].items())
            print(f"  executed {g['executed']:>7} ({g['instructions']} instr): {g['samples_pct']}% of samples; {why}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
