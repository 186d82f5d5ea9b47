"""Prometheus metrics of one gateway app (own CollectorRegistry, no globals).

Gateway-side series are prefixed `pagedweight_gateway_`; the dataplane's
`EngineStats`, fetched at scrape time, are re-exported as `pagedweight_engine_`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admission import AdmissionController
from pagedweight.v1 import inference_pb2

PREFIX = "pagedweight_gateway"
ENGINE_PREFIX = "pagedweight_engine"
# Seconds; spans a fast local GPU (ms) to a long prefill under load (tens of s).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.4, 0.8, 1.6, 5.0)
E2E_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
# Endpoints counted by status; anything else is "other" (bounded label set).
COUNTED_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics"}
)


class EngineStatsCollector(Collector):
    """Exposes the last EngineStats snapshot given to `update`."""

    def __init__(self) -> None:
        self._stats: inference_pb2.EngineStats | None = None

    def update(self, stats: inference_pb2.EngineStats | None) -> None:
        """`None` means the dataplane did not answer: only `_up 0` is exported."""
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        yield GaugeMetricFamily(
            f"{ENGINE_PREFIX}_up", "1 when the dataplane answered the last scrape", value=float(stats is not None)
        )
        if stats is None:
            return
        gauges = {
            "running_requests": (stats.running_requests, "Requests in the running batch"),
            "waiting_requests": (stats.waiting_requests, "Requests waiting for the batch"),
            "kv_blocks_used": (stats.kv_blocks_used, "KV blocks allocated to sequences"),
            "kv_blocks_free": (stats.kv_blocks_free, "KV blocks allocatable now"),
            "kv_block_size_tokens": (stats.kv_block_size, "Tokens per KV block"),
            "arena_page_bytes": (stats.arena.page_bytes, "Bytes per arena page"),
            "arena_pages_total": (stats.arena.total_pages, "Pages in the arena"),
            "arena_pages_free": (stats.arena.free_pages, "Arena pages owned by no one"),
            "arena_pages_kv": (stats.arena.kv_pages, "Arena pages holding KV blocks"),
            "arena_pages_cached": (stats.arena.cached_pages, "Free arena pages still holding a prefix-cache block"),
            "fixed_resident_bytes": (stats.arena.fixed_resident_bytes, "Bytes of fixed residents"),
        }
        for name, (value, doc) in gauges.items():
            yield GaugeMetricFamily(f"{ENGINE_PREFIX}_{name}", doc, value=float(value))
        weights = GaugeMetricFamily(
            f"{ENGINE_PREFIX}_arena_pages_weights", "Arena pages holding expert weights, by bitwidth", labels=["bits"]
        )
        for bits, pages in sorted(stats.arena.weight_pages_by_bits.items()):
            weights.add_metric([str(bits)], float(pages))
        yield weights
        counters = {
            "preemptions": (stats.preemptions_total, "Requests preempted since start"),
            "generated_tokens": (stats.generated_tokens_total, "Tokens generated since start"),
            "prompt_tokens": (stats.prompt_tokens_total, "Prompt tokens prefilled since start"),
            "prefix_cached_tokens": (stats.prefix_cached_tokens_total, "Tokens taken from the prefix cache since start"),
            "finished_requests": (stats.finished_requests_total, "Requests finished since start"),
            "aborted_requests": (stats.aborted_requests_total, "Requests aborted since start"),
            "steps": (stats.steps_total, "Engine steps since start"),
            "kernel_compiles": (stats.kernel_compiles_total,
                                "Triton kernel variants compiled while serving (each stalled a step)"),
        }
        for name, (value, doc) in counters.items():
            yield CounterMetricFamily(f"{ENGINE_PREFIX}_{name}", doc, value=float(value))


class GatewayMetrics:
    """All series of one app. Admission gauges read the controller at scrape."""

    def __init__(self, admission: AdmissionController) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        running = Gauge(f"{PREFIX}_requests_running", "Requests holding admission slots", registry=reg)
        running.set_function(lambda: admission.running)
        slots = Gauge(
            f"{PREFIX}_admission_slots_used", "Admission slots held: one per dataplane sequence (choice)", registry=reg
        )
        slots.set_function(lambda: admission.slots_used)
        waiting = Gauge(f"{PREFIX}_requests_waiting", "Requests queued for an admission slot", registry=reg)
        waiting.set_function(lambda: admission.waiting)
        self.time_to_first_token = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "From request arrival to the first generated token, per choice",
            buckets=TTFT_BUCKETS_S,
            registry=reg,
        )
        self.inter_token_latency = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Gap between generated tokens: each dataplane message of k tokens after a sequence's first one "
            "counts k gaps of dt/k",
            buckets=ITL_BUCKETS_S,
            registry=reg,
        )
        self.request_latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "From request arrival to the end of generation",
            buckets=E2E_BUCKETS_S,
            registry=reg,
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens sent to the dataplane", registry=reg)
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Tokens received from the dataplane", registry=reg
        )
        self.sequences_finished = Counter(
            f"{PREFIX}_sequences_finished",
            "Generated sequences (choices) by finish reason: stop, length, cancelled, error",
            labelnames=["finish_reason"],
            registry=reg,
        )
        self.sequences_resumed = Counter(
            f"{PREFIX}_sequences_resumed",
            "Sequences continued after the dataplane was unreachable during their request",
            registry=reg,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests", "HTTP responses by endpoint and status", labelnames=["endpoint", "status"],
            registry=reg,
        )
        self.engine = EngineStatsCollector()
        reg.register(self.engine)

    def render(self, engine_stats: inference_pb2.EngineStats | None) -> bytes:
        """Prometheus text exposition, with `engine_stats` as the engine snapshot."""
        self.engine.update(engine_stats)
        return generate_latest(self.registry)


class HttpStatusCounter:
    """ASGI middleware counting responses by endpoint and status (pure ASGI,
    so streaming and disconnect handling are untouched)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self._app = app
        self._counter = metrics.http_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in COUNTED_PATHS else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._counter.labels(endpoint=endpoint, status=str(message["status"])).inc()
            await send(message)

        await self._app(scope, receive, counting_send)
