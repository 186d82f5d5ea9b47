"""Condense Nsight Compute CSV reports into one table (kernels as columns).

    ncu --csv --page details ... > a.csv
    python3 benchmarks/ncu_summary.py a.csv b.csv [--json out.json --commit C]

Each report may hold several kernels; a column is "<file stem>:<kernel>".
Rows are the metrics named in METRICS (those the report has), plus every
warp-stall ratio the report carries (smsp__average_warps_issue_stalled_*),
largest first. A reading aid for counter runs, not a benchmark.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

METRICS = (
    "Duration",
    "Registers Per Thread",
    "Static Shared Memory Per Block",
    "Dynamic Shared Memory Per Block",
    "Block Limit Registers",
    "Block Limit Shared Mem",
    "Achieved Occupancy",
    "DRAM Throughput",
    "Memory Throughput",
    "L1/TEX Cache Throughput",
    "L2 Cache Throughput",
    "Compute (SM) Throughput",
    "dram__bytes_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "l1tex__t_sector_hit_rate.pct",
    "lts__t_sector_hit_rate.pct",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "Warp Cycles Per Issued Instruction",
    "Issued Warp Per Scheduler",
    "smsp__inst_executed.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
)
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
KERNEL_NAME_CHARS = 24


def read_report(path: Path) -> dict[str, dict[str, str]]:
    """{kernel column: {metric: "value unit"}} of one CSV report (first launch of each kernel)."""
    text = path.read_text()
    start = text.find('"ID"')
    if start < 0:
        raise ValueError(f"{path}: no ncu CSV header found")
    columns: dict[str, dict[str, str]] = {}
    seen: dict[str, str] = {}
    for row in csv.DictReader(text[start:].splitlines()):
        kernel = row["Kernel Name"][:KERNEL_NAME_CHARS]
        launch = row["ID"]
        if seen.setdefault(kernel, launch) != launch:
            continue
        unit = row.get("Metric Unit", "")
        columns.setdefault(f"{path.stem}:{kernel}", {})[row["Metric Name"]] = \
            f"{row['Metric Value']} {unit}".strip()
    return columns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the table as JSON, with the GPU's name, the date, this command and --commit")
    ap.add_argument("--commit", default="unknown", help="git commit of the profiled tree")
    args = ap.parse_args()
    table: dict[str, dict[str, str]] = {}
    for path in args.reports:
        table.update(read_report(path))
    names = list(table)
    stalls = sorted({m for col in table.values() for m in col if m.startswith(STALL_PREFIX)},
                    key=lambda m: -max(float(col.get(m, "0").split()[0].replace(",", "") or 0)
                                       for col in table.values()))
    rows = [m for m in METRICS if any(m in col for col in table.values())] + stalls
    width = max((len(r.removeprefix(STALL_PREFIX)) for r in rows), default=10)
    print(" | ".join(["metric".ljust(width)] + names))
    for metric in rows:
        label = metric.removeprefix(STALL_PREFIX)
        print(" | ".join([label.ljust(width)] + [table[n].get(metric, "-") for n in names]))
    if args.json:
        args.json.write_text(json.dumps({"device": gpu_name(), "date": datetime.now(timezone.utc).isoformat(
            timespec="seconds"), "commit": args.commit, "command": " ".join(sys.argv), "table": table}, indent=1))


def gpu_name() -> str:
    """The GPU the reports came from (the summary runs beside ncu), or "unknown"."""
    import torch  # only for --json: the table itself needs no torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown"


if __name__ == "__main__":
    main()
