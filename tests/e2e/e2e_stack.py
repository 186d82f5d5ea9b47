"""The three-process stack used by the end-to-end tests (shared constants and
the starter), kept apart from conftest.py so test modules can import it."""

from __future__ import annotations

from pathlib import Path

from launcher.processes import REPO_ROOT, Stack, StackConfig, free_ports

DEFAULT_MODEL = REPO_ROOT / "models" / "pw-moe-tiny"
ADMIN_TOKEN = "e2e-admin-token"
TELEMETRY_INTERVAL_MS = 200


def start_stack(root: Path, model: Path = DEFAULT_MODEL, extra_dataplane_args: list[str] | None = None) -> Stack:
    """Starts controlplane, dataplane and gateway on free ports, logs under ``root``."""
    gateway_port, dataplane_port, controlplane_port = free_ports(3)
    cfg = StackConfig(
        model_path=model,
        gateway_port=gateway_port,
        dataplane_port=dataplane_port,
        controlplane_port=controlplane_port,
        db_path=root / "controlplane.sqlite3",
        admin_token=ADMIN_TOKEN,
        telemetry_interval_ms=TELEMETRY_INTERVAL_MS,
        log_dir=root / "logs",
        extra_dataplane_args=extra_dataplane_args or [],
    )
    stack = Stack(cfg)
    stack.start()
    return stack


def print_logs(root: Path) -> None:
    """Tails of the processes' logs (shown by pytest for failing tests)."""
    for log in sorted((root / "logs").glob("*.log")):
        print(f"----- {log.name} (tail) -----\n{log.read_text(errors='replace')[-3000:]}")
