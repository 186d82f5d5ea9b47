"""Where a benchmark's numbers come from: the measured tree's commit, the
command and the machine, the same way in every result file."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def git_commit(override: str | None = None) -> str:
    """The commit to record for the measured tree.

    ``override`` wins: on the GPU machine the tree travels with a stale
    ``.git``, so its HEAD is not what ran and the caller passes ``--commit``.
    Otherwise HEAD's short id, with "+dirty" when tracked files outside
    benchmarks/results have uncommitted changes (the numbers then come from HEAD plus those), or
    "unknown" without git.
    """
    if override:
        return override
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        # Result files do not count: a rerun rewrites its own tracked JSON.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!benchmarks/results"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def cpu_header(script: str, argv: list[str] | None, commit: str | None = None) -> dict:
    """command / date_utc / commit / device of a CPU benchmark run as ``script``
    with ``argv``; ``commit`` as git_commit's override (a run on the GPU
    machine, whose .git is stale)."""
    args = argv if argv is not None else sys.argv[1:]
    return {
        "command": " ".join([script, *args]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(commit),
        "device": f"cpu ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
                  f"{torch.get_num_threads()} threads",
    }
