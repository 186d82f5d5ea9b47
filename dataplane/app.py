"""The whole dataplane process as one object: engine, gRPC server, telemetry.

Used by the CLI and by tests that need a real dataplane in process. The
hooks a precision controller needs are constructor arguments: the scheduler's
``reclaim_pages``, the ``PrecisionReporter`` telemetry reads, and the plan
callback (default: ``LatestPlan``, readable as ``Dataplane.plans``).
"""

from __future__ import annotations

import logging

from dataplane.config import DataplaneConfig
from dataplane.engine import Engine
from dataplane.engine_builder import build
from dataplane.kernel_compiles import CompileWatch
from dataplane.precision_state import PrecisionReporter, StaticPrecision
from dataplane.scheduler import ReclaimPages
from dataplane.server import ServerThread
from dataplane.telemetry_client import LatestPlan, PlanCallback, TelemetryClient, TelemetryConfig
from dataplane.warmup import HostOnlyBlock, WarmupReport, engine_warmup_rounds, warm_up

log = logging.getLogger(__name__)


class Dataplane:
    """Builds on construction; ``start`` serves and dials; ``stop`` undoes it."""

    def __init__(
        self,
        config: DataplaneConfig,
        *,
        reclaim_pages: ReclaimPages | None = None,
        precision: PrecisionReporter | None = None,
        on_plan: PlanCallback | None = None,
    ) -> None:
        self.config = config
        built = build(config, reclaim_pages=reclaim_pages)
        self.engine: Engine = built.engine
        self.controller = built.precision
        info = self.engine.model_info
        self.precision = precision or self.controller or StaticPrecision(
            info.num_layers, info.num_experts, info.hidden_size, info.ffn_size, self.engine.arena.page_bytes
        )
        self.plans = LatestPlan()
        self.on_plan = on_plan or self._plan_fanout
        self.server = ServerThread(self.engine, config.host, config.port)
        self.telemetry: TelemetryClient | None = None
        self.warmup: WarmupReport | None = None
        self.compiles = CompileWatch(self.engine.count_kernel_compile)

    def _plan_fanout(self, plan) -> None:
        """Keeps the latest plan readable and hands it to the precision controller."""
        self.plans(plan)
        if self.controller is not None:
            self.controller.set_plan(plan)

    def start(self) -> str:
        """Starts the engine, warms it up (config.resolved_warm_up), then starts
        the server and (with a controlplane) telemetry; returns host:port. The
        server reports SERVING only after the warm-up. Triton kernel variants
        compiled from then on are counted and logged (dataplane/kernel_compiles.py)."""
        self.compiles.install()
        self.engine.start()
        if self.config.resolved_warm_up():
            try:
                store = self.controller.store if self.controller is not None else None
                host_only = HostOnlyBlock(self.engine, store) if store is not None else None
                self.warmup = warm_up(self.engine, engine_warmup_rounds(self.engine, host_only is not None),
                                      self.config.warm_up_round_timeout_s, host_only)
            except BaseException:
                self.engine.stop()  # nothing serves yet: leave no engine thread behind
                self.compiles.uninstall()
                raise
            log.info("warm-up: %d requests in %d rounds, %d steps, %.1f s", self.warmup.requests,
                     self.warmup.rounds, self.warmup.steps, self.warmup.seconds)
        self.compiles.serving = True
        port = self.server.start()
        if self.config.controlplane is not None:
            self.telemetry = TelemetryClient(
                TelemetryConfig(
                    target=self.config.controlplane,
                    dataplane_id=self.config.resolved_dataplane_id(port),
                    interval_ms=self.config.telemetry_interval_ms,
                    backoff_initial_s=self.config.telemetry_backoff_initial_s,
                    backoff_max_s=self.config.telemetry_backoff_max_s,
                    token=self.config.controlplane_token,
                ),
                self.engine,
                self.precision,
                self.on_plan,
            )
            self.telemetry.start()
        return self.server.address

    def stop(self) -> None:
        if self.telemetry is not None:
            self.telemetry.stop()
        self.server.stop()
        self.engine.stop()
        self.compiles.uninstall()
