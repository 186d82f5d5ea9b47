"""The controlplane gRPC server: Telemetry + Admin + grpc.health.v1, and
Prometheus /metrics over HTTP when metrics_port is set.

ControlplaneServer owns the store, the registry, the metrics and the
grpc.Server; tests construct it in-process (port 0 picks a free port) and
stop it to simulate a restart. Stopping ends every telemetry stream
(dataplanes keep serving on their last plan and reconnect), the metrics
endpoint, and closes the SQLite file.
"""

from __future__ import annotations

from concurrent import futures

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controlplane.admin_service import AdminService
from controlplane.auth import BearerAuthInterceptor
from controlplane.config import ControlplaneConfig
from controlplane.metrics import AdminCallsInterceptor, ControlplaneMetrics
from controlplane.registry import DataplaneRegistry
from controlplane.store import AdminStore
from controlplane.telemetry_service import TelemetryService
from pagedweight.v1 import admin_pb2, admin_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc

# Seconds in-flight unary calls get to finish on stop.
DEFAULT_STOP_GRACE_S = 1.0

log = logging.getLogger(__name__)


class ControlplaneServer:
    """Contract: start() once, then stop() once; address is valid after start."""

    def __init__(self, cfg: ControlplaneConfig) -> None:
        self.cfg = cfg
        self.store = AdminStore(cfg.db_path)
        self.registry = DataplaneRegistry(self.store, cfg)
        self.metrics = ControlplaneMetrics()
        self.metrics.watch_dataplanes(self.registry.gauges)
        options = [
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ]
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="controlplane"),
            # Counting first, so that rejected calls are counted too.
            interceptors=[AdminCallsInterceptor(self.metrics),
                          BearerAuthInterceptor(cfg.admin_tokens, cfg.telemetry_tokens)],
            options=options,
        )
        telemetry_pb2_grpc.add_TelemetryServicer_to_server(TelemetryService(self.registry, self.metrics), self._server)
        admin_pb2_grpc.add_AdminServicer_to_server(AdminService(self.store, self.registry), self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.port = 0
        self.metrics_port = 0  # bound port of /metrics, 0 when disabled
        self._started = False

    @property
    def address(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    def start(self) -> ControlplaneServer:
        self.port = self._server.add_insecure_port(f"{self.cfg.host}:{self.cfg.port}")
        if self.port == 0:
            raise RuntimeError(f"cannot bind {self.cfg.host}:{self.cfg.port}")
        self._server.start()
        self._started = True
        if self.cfg.metrics_port:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_host, self.cfg.metrics_port)
        if not self.cfg.telemetry_tokens:
            log.warning("no telemetry tokens: any dataplane that reaches %s may stream telemetry", self.address)
        for name in ("", telemetry_pb2.DESCRIPTOR.services_by_name["Telemetry"].full_name,
                     admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def wait(self) -> None:
        """Blocks until the server terminates."""
        self._server.wait_for_termination()

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        if self._started:
            self._health.enter_graceful_shutdown()
            self.registry.close()
            self._server.stop(grace_s).wait()
            self.metrics.stop()
            self._started = False
        self.store.close()
