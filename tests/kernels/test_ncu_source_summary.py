"""benchmarks/ncu_source_summary.py on a small source page: samples grouped
by how often each instruction ran, the once-per-warp code found from the
kernel's first instruction."""

import csv
import gzip

import pytest

from benchmarks.ncu_source_summary import read_source_page, summarize

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
          "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [
    ["0x0", "LDC R1, c[0x0][0x28]", "1", "8", "0", "1", "0"],
    ["0x10", "ISETP.LE.AND P0, PT, R2, UR4, PT", "5", "8", "5", "0", "5"],
    ["0x20", "IDP.2A.LO.S16.U8 R1, R2, R3, R1", "12", "256", "2", "10", "2"],
    ["0x30", "BRA 0x20", "2", "256", "0", "2", "0"],
    ["0x40", "EXIT", "0", "0", "0", "0", "0"],
]


def write_page(path, rows=ROWS, opener=open):
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "_moe_gate_up_kernel"])
        w.writerow(HEADER)
        w.writerows(rows)


@pytest.mark.parametrize("gz", [False, True])
def test_groups_by_execution_count(tmp_path, gz):
    path = tmp_path / ("page.csv.gz" if gz else "page.csv")
    write_page(path, opener=gzip.open if gz else open)
    s = summarize(read_source_page(path))
    assert s["samples"] == 20 and s["executed_once_per_warp"] == 8
    loop, once = s["groups"]
    assert (loop["executed"], loop["instructions"], loop["samples_pct"]) == (256, 2, 70.0)
    assert loop["reasons_pct"] == {"wait": 85.7, "long_sb": 14.3}  # Not-issued columns are not reasons
    assert (once["executed"], once["samples_pct"]) == (8, 30.0)
    assert s["once_per_warp_top"][0] == {"sass": "ISETP.LE.AND P0, PT, R2, UR4, PT", "samples_pct": 25.0,
                                         "reason": "long_sb"}


def test_rejects_pages_without_samples_or_header(tmp_path):
    path = tmp_path / "empty.csv"
    write_page(path, [r[:2] + ["0"] + r[3:] for r in ROWS])
    with pytest.raises(ValueError, match="no warp-stall samples"):
        summarize(read_source_page(path))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no source-page header"):
        read_source_page(bad)
