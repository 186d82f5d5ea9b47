"""Start, health-check and stop the three PagedWeight processes.

Used by the serve command (`python -m launcher`) and by the end-to-end tests,
so both run exactly the same command lines. Each service is its own OS
process speaking gRPC/HTTP; nothing is shared in memory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
# The bundled default model (`make serve` serves it).
DEFAULT_MODEL = REPO_ROOT / "models" / "pw-moe-tiny"
POLL_INTERVAL_S = 0.2


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free on 127.0.0.1 right now.

    The sockets stay open until all are chosen, so the kernel cannot hand the
    same port out twice.
    """
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class StackConfig:
    """Where and how to run the three processes."""

    model_path: Path
    gateway_port: int
    dataplane_port: int
    controlplane_port: int
    db_path: Path
    admin_token: str
    # Bearer token of the dataplane -> controlplane Telemetry stream; handed
    # to both through the environment (never on a command line). None: the
    # stream is open.
    telemetry_token: str | None = None
    # Controlplane Prometheus /metrics port (0 = off).
    controlplane_metrics_port: int = 0
    host: str = "127.0.0.1"
    gpu_memory_gb: float | None = None
    telemetry_interval_ms: int | None = None
    log_dir: Path | None = None
    extra_dataplane_args: list[str] = field(default_factory=list)
    extra_gateway_args: list[str] = field(default_factory=list)
    # How long the dataplane may take to report SERVING: loading, then (on a
    # GPU) its start-up warm-up, which on an empty Triton cache compiles
    # every tile class first (249 s at Mixtral-8x7B shapes on an H100,
    # benchmarks/results/memory_pressure_warmup_h100_s42.json).
    dataplane_start_timeout_s: float = 900.0

    @property
    def gateway_url(self) -> str:
        return f"http://{self.host}:{self.gateway_port}"

    @property
    def dataplane_address(self) -> str:
        return f"{self.host}:{self.dataplane_port}"

    @property
    def controlplane_address(self) -> str:
        return f"{self.host}:{self.controlplane_port}"

    @property
    def controlplane_metrics_url(self) -> str | None:
        port = self.controlplane_metrics_port
        return f"http://{self.host}:{port}/metrics" if port else None


def loopback_stack_config(
    model: Path,
    state_dir: Path,
    admin_token: str,
    telemetry_interval_ms: int | None = None,
    extra_dataplane_args: list[str] | None = None,
) -> StackConfig:
    """A stack on free loopback ports with its state (SQLite file, logs)
    under ``state_dir``: for tests and benchmarks that start their own."""
    gateway_port, dataplane_port, controlplane_port = free_ports(3)
    return StackConfig(
        model_path=model,
        gateway_port=gateway_port,
        dataplane_port=dataplane_port,
        controlplane_port=controlplane_port,
        db_path=state_dir / "controlplane.sqlite3",
        admin_token=admin_token,
        telemetry_interval_ms=telemetry_interval_ms,
        log_dir=state_dir / "logs",
        extra_dataplane_args=list(extra_dataplane_args or []),
    )


def controlplane_env(cfg: StackConfig) -> dict[str, str]:
    """Settings passed to the controlplane through its environment (controlplane/config.py)."""
    return {"PW_CONTROLPLANE_TELEMETRY_TOKENS": json.dumps([cfg.telemetry_token])} if cfg.telemetry_token else {}


def dataplane_env(cfg: StackConfig) -> dict[str, str]:
    """Settings passed to the dataplane through its environment (dataplane/config.py)."""
    return {"PW_DATAPLANE_CONTROLPLANE_TOKEN": cfg.telemetry_token} if cfg.telemetry_token else {}


def controlplane_command(cfg: StackConfig) -> list[str]:
    return [
        sys.executable, "-m", "controlplane",
        "--host", cfg.host, "--port", str(cfg.controlplane_port),
        "--db", str(cfg.db_path), "--admin-token", cfg.admin_token,
        "--metrics-port", str(cfg.controlplane_metrics_port),
    ]


def dataplane_command(cfg: StackConfig) -> list[str]:
    cmd = [
        sys.executable, "-m", "dataplane",
        "--model", str(cfg.model_path),
        "--host", cfg.host, "--port", str(cfg.dataplane_port),
        "--controlplane", cfg.controlplane_address,
    ]
    if cfg.gpu_memory_gb is not None:
        cmd += ["--gpu-memory-gb", str(cfg.gpu_memory_gb)]
    if cfg.telemetry_interval_ms is not None:
        cmd += ["--telemetry-interval-ms", str(cfg.telemetry_interval_ms)]
    return cmd + cfg.extra_dataplane_args


def gateway_command(cfg: StackConfig) -> list[str]:
    return [
        sys.executable, "-m", "gateway",
        "--host", cfg.host, "--port", str(cfg.gateway_port),
        "--dataplane", cfg.dataplane_address,
    ] + cfg.extra_gateway_args


class ManagedProcess:
    """One child process with its log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, command: list[str], log_dir: Path | None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.command = command
        self._log = None
        stdout = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._log = open(log_dir / f"{name}.log", "ab")
            stdout = self._log
        env = dict(os.environ)
        env.update(extra_env or {})
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.popen = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_grpc_healthy(address: str, proc: ManagedProcess, timeout_s: float) -> None:
    """Blocks until the gRPC health service at ``address`` answers SERVING."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with code {proc.popen.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"{proc.name} at {address} not healthy after {timeout_s} s")


def wait_http_healthy(url: str, proc: ManagedProcess, timeout_s: float) -> None:
    """Blocks until GET ``url`` answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with code {proc.popen.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"{proc.name} at {url} not healthy after {timeout_s} s")


class Stack:
    """The three processes, started in dependency order and stopped in reverse."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.processes: dict[str, ManagedProcess] = {}

    def start_controlplane(self, timeout_s: float = 60.0) -> None:
        proc = ManagedProcess("controlplane", controlplane_command(self.cfg), self.cfg.log_dir,
                              controlplane_env(self.cfg))
        self.processes["controlplane"] = proc
        wait_grpc_healthy(self.cfg.controlplane_address, proc, timeout_s)

    def start_dataplane(self) -> None:
        """Starts the dataplane and waits up to the config's
        dataplane_start_timeout_s for it to report SERVING."""
        proc = ManagedProcess("dataplane", dataplane_command(self.cfg), self.cfg.log_dir, dataplane_env(self.cfg))
        self.processes["dataplane"] = proc
        wait_grpc_healthy(self.cfg.dataplane_address, proc, self.cfg.dataplane_start_timeout_s)

    def start_gateway(self, timeout_s: float = 60.0) -> None:
        proc = ManagedProcess("gateway", gateway_command(self.cfg), self.cfg.log_dir)
        self.processes["gateway"] = proc
        wait_http_healthy(f"{self.cfg.gateway_url}/health", proc, timeout_s)

    def start(self) -> None:
        try:
            self.start_controlplane()
            self.start_dataplane()
            self.start_gateway()
        except BaseException:
            self.stop()
            raise

    def stop_one(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def stop(self) -> None:
        for name in ("gateway", "dataplane", "controlplane"):
            self.stop_one(name)

    def exited(self) -> dict[str, int]:
        """Processes that were started and have exited: name -> exit code."""
        return {name: proc.popen.returncode for name, proc in self.processes.items() if not proc.alive()}

    def restart(self, name: str) -> None:
        """Starts ``name`` again on the same ports and waits until it is
        healthy. On failure the new process is stopped but stays registered
        (as exited) and the error is raised."""
        starters = {
            "controlplane": self.start_controlplane,
            "dataplane": self.start_dataplane,
            "gateway": self.start_gateway,
        }
        if name not in starters:
            raise ValueError(f"no process named {name!r}")
        self.stop_one(name)
        try:
            starters[name]()
        except BaseException:
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop()
            raise
