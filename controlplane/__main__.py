"""Runs the controlplane server.

    python -m controlplane --port 50052 --db cp.sqlite3 --admin-token TOKEN

Flags override the environment (controlplane/config.py); prints
"controlplane serving on HOST:PORT" once it listens (port 0 = a free port).
Stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from pydantic import ValidationError

from controlplane.config import ControlplaneConfig
from controlplane.server import ControlplaneServer

# How often the main thread looks for a received SIGINT / SIGTERM.
SIGNAL_POLL_S = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to bind; 0 picks a free one")
    parser.add_argument("--db", dest="db_path", help="SQLite file of the admin state")
    parser.add_argument("--admin-token", dest="admin_tokens", action="append",
                        help="accepted Admin bearer token (repeatable)")
    parser.add_argument("--telemetry-token", dest="telemetry_tokens", action="append",
                        help="bearer token dataplanes must send on Telemetry (repeatable; "
                             "better as PW_CONTROLPLANE_TELEMETRY_TOKENS, off the process list)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics HTTP port (0 = off)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {k: v for k, v in vars(args).items() if k != "log_level" and v is not None}
    for key in ("admin_tokens", "telemetry_tokens"):
        if key in overrides:
            overrides[key] = tuple(overrides[key])
    try:
        cfg = ControlplaneConfig(**overrides)
    except ValidationError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    # Appending is all the handler does: setting a threading.Event there can
    # deadlock (see dataplane/__main__.py). Installed before the start.
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    server = ControlplaneServer(cfg).start()
    metrics = f", metrics http://{cfg.metrics_host}:{server.metrics_port}/metrics" if server.metrics_port else ""
    print(f"controlplane serving on {server.address} (db {cfg.db_path}{metrics})", flush=True)
    while not received:
        time.sleep(SIGNAL_POLL_S)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
