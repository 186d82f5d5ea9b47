"""Merges the e2e_decode.py JSON files of one device call into one file and
prints a table of them (the device returns at most 8 files a call).

    python benchmarks/merge_runs.py RUNS_DIR OUT.json

OUT.json is {"runs": {file stem: that file's JSON}}; the table has a line per
(run, bits, batch): tok/s and % of the anchor roofline (e2e_decode.py's
docstring), with the median per (variant, bits, batch) over the rounds when
the stems end in _r<round>.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

ROUND = re.compile(r"^(?P<variant>.+)_r(?P<round>[a-z0-9]+)$")


def merge(runs_dir: Path) -> dict:
    """{"runs": {stem: JSON}} of every *.json under runs_dir, sorted by stem."""
    return {"runs": {p.stem: json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))}}


def table(merged: dict) -> list[str]:
    """Lines: every row of every run, then the medians per variant over rounds."""
    lines = [f"{'run':44} {'bits':>8} {'B':>3} {'tok/s':>9} {'% anchor':>9}"]
    per_variant: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for stem, run in merged["runs"].items():
        match = ROUND.match(stem)
        variant = match["variant"] if match else stem
        for row in run.get("rows", []):
            lines.append(f"{stem:44} {row['bits']:>8} {row['batch']:>3} {row['tok_per_s']:9.1f} "
                         f"{row['pct_roofline_anchor']:9.2f}")
            per_variant[(variant, row["bits"], row["batch"])].append(row["tok_per_s"])
        if not run.get("complete", True):
            lines.append(f"{stem:44} incomplete")
    lines.append("median over rounds:")
    for (variant, bits, batch), values in sorted(per_variant.items()):
        lines.append(f"{variant:44} {bits:>8} {batch:>3} {statistics.median(values):9.1f}  "
                     f"({', '.join(f'{v:.1f}' for v in values)})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    merged = merge(args.runs_dir)
    args.out.write_text(json.dumps(merged, indent=1))
    print("\n".join(table(merged)))


if __name__ == "__main__":
    main()
