"""Prometheus metrics of one controlplane server (``/metrics`` over HTTP).

Each ControlplaneServer owns one ``ControlplaneMetrics`` with its own
CollectorRegistry (no module-level state: two servers in one process, as in
the tests, never share counters). Counters are bumped by the services;
per-dataplane gauges are read from the DataplaneRegistry at scrape time, so
they are never stale:

* pagedweight_controlplane_dataplanes_registered / _connected
* pagedweight_controlplane_telemetry_reports_total
* pagedweight_controlplane_plans_sent_total
* pagedweight_controlplane_admin_calls_total{method, code}
* pagedweight_controlplane_ladder_rungs{dataplane_id, direction}
* pagedweight_controlplane_predicted_quality_cost{dataplane_id}
  (as the dataplane last reported it)
* pagedweight_controlplane_plan_predicted_budget_cost{dataplane_id}
  (the planner's prediction for the budget state of the last plan)
* pagedweight_controlplane_sensitivity_fallback{dataplane_id}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

ADMIN_METHOD_PREFIX = "/pagedweight.v1.Admin/"
PREFIX = "pagedweight_controlplane"


@dataclass(frozen=True)
class DataplaneGauges:
    """What the scrape reads of one dataplane (DataplaneRegistry.gauges)."""

    dataplane_id: str
    connected: bool
    predicted_quality_cost: float
    plan_predicted_budget_cost: float
    demotion_rungs: int
    promotion_rungs: int
    sensitivity_fallback: bool


class _DataplaneCollector(Collector):
    def __init__(self, source: Callable[[], list[DataplaneGauges]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        rows = self._source()
        registered = GaugeMetricFamily(f"{PREFIX}_dataplanes_registered", "Dataplanes registered since start")
        registered.add_metric([], len(rows))
        connected = GaugeMetricFamily(f"{PREFIX}_dataplanes_connected", "Dataplanes whose telemetry stream is open")
        connected.add_metric([], sum(r.connected for r in rows))
        rungs = GaugeMetricFamily(f"{PREFIX}_ladder_rungs", "Rungs of the last plan sent",
                                  labels=["dataplane_id", "direction"])
        quality = GaugeMetricFamily(f"{PREFIX}_predicted_quality_cost",
                                    "Predicted quality cost of the dataplane's precision state, as reported",
                                    labels=["dataplane_id"])
        planned = GaugeMetricFamily(f"{PREFIX}_plan_predicted_budget_cost",
                                    "Planner's predicted quality cost of the last plan's budget state",
                                    labels=["dataplane_id"])
        fallback = GaugeMetricFamily(f"{PREFIX}_sensitivity_fallback",
                                     "1 when the dataplane is planned with the fallback error model",
                                     labels=["dataplane_id"])
        for r in rows:
            rungs.add_metric([r.dataplane_id, "demotion"], r.demotion_rungs)
            rungs.add_metric([r.dataplane_id, "promotion"], r.promotion_rungs)
            quality.add_metric([r.dataplane_id], r.predicted_quality_cost)
            planned.add_metric([r.dataplane_id], r.plan_predicted_budget_cost)
            fallback.add_metric([r.dataplane_id], float(r.sensitivity_fallback))
        yield from (registered, connected, rungs, quality, planned, fallback)


class ControlplaneMetrics:
    """The server's registry, its counters, and the optional HTTP exporter."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reports = Counter(f"{PREFIX}_telemetry_reports", "Telemetry reports received",
                               registry=self.registry)
        self.plans = Counter(f"{PREFIX}_plans_sent", "Precision plans sent to dataplanes", registry=self.registry)
        self.admin_calls = Counter(f"{PREFIX}_admin_calls", "Admin calls by method and status code",
                                   labelnames=["method", "code"], registry=self.registry)
        self._http: WSGIServer | None = None

    def watch_dataplanes(self, source: Callable[[], list[DataplaneGauges]]) -> None:
        self.registry.register(_DataplaneCollector(source))

    def serve(self, host: str, port: int) -> int:
        """Starts /metrics on host:port (0 = a free port); returns the port."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_address[1])

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class AdminCallsInterceptor(grpc.ServerInterceptor):
    """Counts Admin calls by method and final status code (rejected ones
    too: it sits in front of the auth interceptor)."""

    def __init__(self, metrics: ControlplaneMetrics) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(ADMIN_METHOD_PREFIX) or handler.unary_unary is None:
            return handler
        name = method[len(ADMIN_METHOD_PREFIX):]
        behavior, counter = handler.unary_unary, self._metrics.admin_calls

        def counted(request, context: grpc.ServicerContext):
            try:
                response = behavior(request, context)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                counter.labels(method=name, code=code.name).inc()
                raise
            counter.labels(method=name, code=(context.code() or grpc.StatusCode.OK).name).inc()
            return response

        return grpc.unary_unary_rpc_method_handler(
            counted, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
