"""`python -m launcher`: serve all three processes on one machine.

Prints the OpenAI-compatible API address once everything is healthy, restarts
a process that exits (the other two keep serving; launcher/supervisor.py) and
stops all three on Ctrl-C, or when one keeps exiting.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.processes import DEFAULT_MODEL, REPO_ROOT, Stack, StackConfig, free_ports
from launcher.supervisor import RestartPolicy, Supervisor

DEFAULT_STATE_DIR = REPO_ROOT / ".cache" / "serve"
WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class LaunchConfig:
    """The stack and how it is supervised."""

    stack: StackConfig
    restart: RestartPolicy


def parse_args(argv: list[str]) -> LaunchConfig:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="HF model folder")
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway binds")
    parser.add_argument("--port", type=int, default=8000, help="gateway (HTTP) port")
    parser.add_argument("--dataplane-port", type=int, default=50051)
    parser.add_argument("--controlplane-port", type=int, default=50052)
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help="dataplane memory budget (weights + KV)")
    parser.add_argument("--admin-token", default=None,
                        help="controlplane admin token (random when omitted; printed)")
    parser.add_argument("--controlplane-metrics-port", type=int, default=None,
                        help="controlplane /metrics HTTP port (a free one when omitted; 0 = off)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="controlplane SQLite file and the processes' logs")
    parser.add_argument("--max-restarts", type=int, default=RestartPolicy.max_restarts,
                        help="restarts of one process within --restart-window-s before the stack stops "
                             "(0: the first exit stops the stack)")
    parser.add_argument("--restart-window-s", type=float, default=RestartPolicy.window_s)
    parser.add_argument("--dataplane-start-timeout-s", type=float, default=StackConfig.dataplane_start_timeout_s,
                        help="how long the dataplane may take to report SERVING (on a GPU its first start "
                             "compiles kernels in its warm-up)")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        parser.error(f"no model at {args.model} (missing config.json)")
    try:
        policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window_s)
    except ValueError as exc:
        parser.error(str(exc))
    if args.dataplane_start_timeout_s <= 0:
        parser.error("--dataplane-start-timeout-s must be > 0")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    stack = StackConfig(
        model_path=args.model,
        host=args.host,
        gateway_port=args.port,
        dataplane_port=args.dataplane_port,
        controlplane_port=args.controlplane_port,
        db_path=args.state_dir / "controlplane.sqlite3",
        admin_token=args.admin_token or secrets.token_urlsafe(16),
        # The dataplane link gets its own random token on every start.
        telemetry_token=secrets.token_urlsafe(16),
        controlplane_metrics_port=(free_ports(1)[0] if args.controlplane_metrics_port is None
                                   else args.controlplane_metrics_port),
        gpu_memory_gb=args.gpu_memory_gb,
        log_dir=args.state_dir / "logs",
        dataplane_start_timeout_s=args.dataplane_start_timeout_s,
    )
    return LaunchConfig(stack=stack, restart=policy)


def main(argv: list[str]) -> int:
    launch = parse_args(argv)
    cfg = launch.stack
    stack = Stack(cfg)
    supervisor = Supervisor(stack, launch.restart)
    stopping = False

    def on_signal(signum, frame):  # noqa: ARG001 (signal handler signature)
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"starting PagedWeight on {cfg.model_path} (logs in {cfg.log_dir})", flush=True)
    stack.start()
    print(
        f"\nPagedWeight is serving.\n"
        f"  OpenAI API:   {cfg.gateway_url}/v1   (model list: {cfg.gateway_url}/v1/models)\n"
        f"  metrics:      {cfg.gateway_url}/metrics"
        f"{'   controlplane: ' + cfg.controlplane_metrics_url if cfg.controlplane_metrics_url else ''}\n"
        f"  admin (gRPC): {cfg.controlplane_address}  token: {cfg.admin_token}\n"
        f"A process that exits is restarted; Ctrl-C stops all three.",
        flush=True,
    )
    try:
        while not stopping:
            failing = supervisor.check()
            if failing:
                print(f"{failing} keeps exiting; stopping (see {cfg.log_dir}/{failing}.log)", file=sys.stderr)
                return 1
            time.sleep(WATCH_INTERVAL_S)
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
