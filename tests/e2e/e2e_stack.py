"""The three-process stack used by the end-to-end tests (shared constants and
the starter), kept apart from conftest.py so test modules can import it."""

from __future__ import annotations

from pathlib import Path

from launcher.processes import DEFAULT_MODEL, Stack, loopback_stack_config
ADMIN_TOKEN = "e2e-admin-token"
TELEMETRY_INTERVAL_MS = 200


def start_stack(root: Path, model: Path = DEFAULT_MODEL, extra_dataplane_args: list[str] | None = None) -> Stack:
    """Starts controlplane, dataplane and gateway on free ports, logs under ``root``."""
    stack = Stack(loopback_stack_config(model, root, ADMIN_TOKEN, TELEMETRY_INTERVAL_MS, extra_dataplane_args))
    stack.start()
    return stack


def print_logs(root: Path) -> None:
    """Tails of the processes' logs (shown by pytest for failing tests)."""
    for log in sorted((root / "logs").glob("*.log")):
        print(f"----- {log.name} (tail) -----\n{log.read_text(errors='replace')[-3000:]}")
