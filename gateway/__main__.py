"""`python -m gateway --port 8000 --dataplane 127.0.0.1:50051`

Flags override the PAGEDWEIGHT_GATEWAY_* environment variables (see
gateway/config.py). Prints `serving on http://HOST:PORT` once the socket is
bound (with --port 0, the port picked by the OS).
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn
from pydantic import ValidationError

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.dataplane_client import GrpcDataplaneClient

# Flags that map 1:1 onto GatewaySettings fields (flag --foo-bar -> foo_bar).
_FLAGS: dict[str, tuple[type, str]] = {
    "host": (str, "interface to bind"),
    "port": (int, "HTTP port (0: any free port)"),
    "dataplane": (str, "dataplane Inference gRPC address HOST:PORT"),
    "model-name": (str, "model name to serve instead of the dataplane's"),
    "max-concurrent-requests": (int, "dataplane sequences (choices) generating at once"),
    "max-queued-requests": (int, "requests waiting; beyond: 429"),
    "retry-after-s": (int, "Retry-After seconds on 429"),
    "request-timeout-s": (float, "deadline of one request"),
    "dataplane-wait-s": (float, "wait for an unreachable dataplane before 503"),
    "dataplane-outages": (int, "dataplane losses one sequence survives (continued once it is back)"),
}


def parse_settings(argv: list[str]) -> tuple[GatewaySettings, str]:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="PagedWeight OpenAI-compatible gateway")
    for flag, (kind, help_text) in _FLAGS.items():
        parser.add_argument(f"--{flag}", type=kind, default=None, help=help_text)
    parser.add_argument("--api-key", action="append", default=None, help="accepted bearer key (repeatable)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    overrides = {
        flag.replace("-", "_"): getattr(args, flag.replace("-", "_"))
        for flag in _FLAGS
        if getattr(args, flag.replace("-", "_")) is not None
    }
    if args.api_key is not None:
        overrides["api_keys"] = tuple(args.api_key)
    try:
        return GatewaySettings(**overrides), args.log_level
    except ValidationError as error:
        parser.error(str(error))


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket for uvicorn. The protocol must be IPPROTO_TCP
    explicitly: asyncio enables TCP_NODELAY only on sockets that say so, and
    without it Nagle + delayed ACK add ~40 ms to every response."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(socket.SOMAXCONN)
    return sock


def main(argv: list[str] | None = None) -> int:
    settings, log_level = parse_settings(sys.argv[1:] if argv is None else argv)
    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    client = GrpcDataplaneClient(settings.dataplane, wait_s=settings.dataplane_wait_s)
    app = create_app(settings, client)
    print(f"serving on http://{shown_host}:{port} (dataplane {settings.dataplane})", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
