"""How the planned cases of benchmarks/memory_pressure.py serve their
controlplane: ``python -m controlplane`` in its own process, as deployed
(``planned``, ``planned-floor``), or its server in the engine's process
(``planned-inline``). Each context manager yields the controlplane's address
and a reader of the CPU seconds its own process has spent (None when it
shares the engine's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.config import ControlplaneConfig, PlannerConfig
from controlplane.server import ControlplaneServer

ADMIN_TOKEN = "memory-pressure-benchmark"  # the controlplane serves no Admin without one; nobody calls it
CONTROLPLANE_START_TIMEOUT_S = 120.0
CONTROLPLANE_STOP_TIMEOUT_S = 30.0
SERVING_LINE = re.compile(r"controlplane serving on (\S+)")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5), in clock ticks
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


@contextmanager
def controlplane_process(tmp: str, planner: PlannerConfig) -> Iterator[tuple[str, Callable[[], float | None]]]:
    """``python -m controlplane`` on a free port (the planner's fields in its
    environment, as a deployment sets them); yields its address and a reader
    of its CPU seconds so far, stops it with SIGTERM."""
    env = {**os.environ, "PW_CONTROLPLANE_PLANNER": planner.model_dump_json()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "--port", "0", "--db", str(Path(tmp) / "controlplane.sqlite3"),
         "--admin-token", ADMIN_TOKEN, "--log-level", "WARNING"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.perf_counter() + CONTROLPLANE_START_TIMEOUT_S
        address = None
        while address is None:  # readline blocks until its line or EOF (the process died)
            line = proc.stdout.readline()
            if not line or time.perf_counter() > deadline:
                raise RuntimeError(f"the controlplane did not start (exit code {proc.poll()})")
            match = SERVING_LINE.search(line)
            address = match.group(1) if match else None
        yield address, lambda: process_cpu_seconds(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=CONTROLPLANE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def controlplane_inline(tmp: str, planner: PlannerConfig) -> Iterator[tuple[str, Callable[[], float | None]]]:
    """The controlplane's server in this process (``planned-inline``; its CPU
    time is not told apart from the engine's)."""
    server = ControlplaneServer(ControlplaneConfig(
        port=0, db_path=str(Path(tmp) / "controlplane.sqlite3"), admin_tokens=(ADMIN_TOKEN,),
        planner=planner)).start()
    try:
        yield server.address, lambda: None
    finally:
        server.stop()
