"""How the planned cases of benchmarks/memory_pressure.py serve their
controlplane: ``python -m controlplane`` in its own process, as deployed
(``planned``, ``planned-floor``), or its server in the engine's process
(``planned-inline``). Each context manager yields the controlplane's address
and a reader of the CPU seconds its own process has spent (None when it
shares the engine's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.config import ControlplaneConfig, PlannerConfig
from controlplane.server import ControlplaneServer
from launcher.processes import ManagedProcess, free_ports, wait_grpc_healthy

ADMIN_TOKEN = "memory-pressure-benchmark"  # the controlplane serves no Admin without one; nobody calls it
CONTROLPLANE_START_TIMEOUT_S = 120.0
CONTROLPLANE_STOP_TIMEOUT_S = 30.0


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
    """``python -m controlplane`` on a free port, started and stopped as the
    launcher does (launcher/processes.py), the planner's fields in its
    environment as a deployment sets them; yields its address and a reader of
    its CPU seconds so far."""
    port = free_ports(1)[0]
    proc = ManagedProcess(
        "controlplane",
        [sys.executable, "-m", "controlplane", "--port", str(port), "--db", str(Path(tmp) / "controlplane.sqlite3"),
         "--admin-token", ADMIN_TOKEN, "--log-level", "WARNING"],
        log_dir=None, extra_env={"PW_CONTROLPLANE_PLANNER": planner.model_dump_json()})
    try:
        address = f"127.0.0.1:{port}"
        wait_grpc_healthy(address, proc, CONTROLPLANE_START_TIMEOUT_S)
        yield address, lambda: process_cpu_seconds(proc.popen.pid)
    finally:
        proc.stop(CONTROLPLANE_STOP_TIMEOUT_S)


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
