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
from dataplane.kernel_keys import settle_cache_keys
from dataplane.kernel_manifest import VariantRecorder, read_manifest
from dataplane.kernel_precompile import PrecompileReport, precompile
from dataplane.precision_state import PrecisionReporter, StaticPrecision
from dataplane.scheduler import ReclaimPages
from dataplane.server import ServerThread
from dataplane.telemetry_client import LatestPlan, PlanCallback, TelemetryClient, TelemetryConfig
from dataplane.warmup import WarmupReport, engine_warmup_rounds, warm_up

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
        self.settled_keys = self._settle_kernel_keys(config)
        self.variants = VariantRecorder() if config.kernel_manifest_out is not None else None
        self.precompiled: PrecompileReport | None = self._precompile(config, self.variants)
        # The build launches kernels of its own (quantize/pack on load): recorded too.
        build_watch = CompileWatch(_ignore, self.variants.add) if self.variants is not None else None
        if build_watch is not None:
            build_watch.install()
        try:
            built = build(config, reclaim_pages=reclaim_pages)
        finally:
            if build_watch is not None:
                build_watch.uninstall()
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
        self.compiles = CompileWatch(self.engine.count_kernel_compile,
                                     self.variants.add if self.variants is not None else None)

    @staticmethod
    def _settle_kernel_keys(config: DataplaneConfig) -> int | None:
        """On CUDA, every kernel's Triton cache key taken before anything
        compiles (dataplane/kernel_keys.py), so that this process finds the
        disk-cache entries an earlier process wrote whatever it compiles
        first; the count, or None on the CPU (the interpreter compiles nothing)."""
        if config.resolved_device().type != "cuda":
            return None
        settled = settle_cache_keys()
        log.info("Triton cache keys of %d kernel functions taken before any compile", settled)
        return settled

    @staticmethod
    def _precompile(config: DataplaneConfig, recorder: VariantRecorder | None) -> PrecompileReport | None:
        """Compiles config.kernel_manifest's variants before the build: its
        workers then share neither the GPU memory the build sizes the arena
        from nor the cores the build uses. A manifest that cannot be read
        fails the start (ValueError) before anything is built. The manifest's
        variants go to ``recorder`` too: preloaded, they sit in the in-memory
        caches, where no later launch reports them."""
        if config.kernel_manifest is None:
            return None
        variants = read_manifest(config.kernel_manifest)
        if recorder is not None:
            for variant in variants:
                recorder.add(variant)
        if config.resolved_device().type != "cuda":
            log.info("kernel manifest %s not precompiled: nothing compiles on %s", config.kernel_manifest,
                     config.resolved_device())
            return None
        return precompile(variants, config.precompile_workers)

    def _write_manifest(self) -> None:
        if self.variants is None:
            return
        count = self.variants.write(self.config.kernel_manifest_out)
        log.info("kernel manifest: %d variants written to %s", count, self.config.kernel_manifest_out)

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
                self.warmup = warm_up(self.engine, engine_warmup_rounds(self.engine),
                                      self.config.warm_up_round_timeout_s)
            except BaseException:
                self.engine.stop()  # nothing serves yet: leave no engine thread behind
                self.compiles.uninstall()
                raise
            log.info("warm-up: %d requests in %d rounds, %d steps, %.1f s", self.warmup.requests,
                     self.warmup.rounds, self.warmup.steps, self.warmup.seconds)
        self.compiles.serving = True
        self._write_manifest()
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
        self._write_manifest()


def _ignore(_kernel: str) -> None:
    """The build's watch counts nothing: the engine's counters start at serving."""
