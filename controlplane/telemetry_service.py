"""gRPC Telemetry service: the dataplane's bidirectional stream.

Connect reads the Hello on the handler thread (INVALID_ARGUMENT when the first
message is not a valid Hello), answers a Welcome, then hands the rest of the
request stream to a reader thread (reports -> registry) while the handler
thread writes plans as the registry produces them. A protocol error seen by
the reader (a second Hello, a report whose shapes disagree with the Hello)
ends the stream with INVALID_ARGUMENT from the handler thread, the only one
allowed to abort the RPC.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

import grpc

from controlplane.metrics import ControlplaneMetrics
from controlplane.registry import DataplaneRegistry, Session, SessionEnded, SessionFailed
from pagedweight.v1 import telemetry_pb2, telemetry_pb2_grpc

log = logging.getLogger(__name__)

# How often the writer wakes to notice a cancelled RPC when no plan is due.
WRITER_POLL_S = 1.0


class TelemetryService(telemetry_pb2_grpc.TelemetryServicer):
    """Serves Telemetry.Connect over a DataplaneRegistry."""

    def __init__(self, registry: DataplaneRegistry, metrics: ControlplaneMetrics) -> None:
        self._registry = registry
        self._metrics = metrics

    def Connect(
        self, request_iterator: Iterator[telemetry_pb2.DataplaneMessage], context: grpc.ServicerContext
    ) -> Iterator[telemetry_pb2.ControlplaneMessage]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello")
        try:
            session = self._registry.register(first.hello)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad Hello: {exc}")
        log.info("dataplane %s connected (session %s)", session.dataplane_id, session.session_id)
        context.add_callback(lambda: self._registry.disconnect(session))
        threading.Thread(
            target=self._read, args=(request_iterator, session), name=f"telemetry-{session.dataplane_id}", daemon=True
        ).start()
        yield telemetry_pb2.ControlplaneMessage(welcome=telemetry_pb2.Welcome(session_id=session.session_id))
        while context.is_active():
            try:
                plan = self._registry.wait_plan(session, WRITER_POLL_S)
            except SessionFailed as failure:
                log.warning("dataplane %s: %s", session.dataplane_id, failure.message)
                self._registry.disconnect(session)
                context.abort(failure.code, failure.message)
            except SessionEnded:
                return
            if plan is not None:
                self._metrics.plans.inc()
                yield telemetry_pb2.ControlplaneMessage(plan=plan)

    def _read(self, request_iterator: Iterator[telemetry_pb2.DataplaneMessage], session: Session) -> None:
        """Feeds reports to the registry until the stream ends or breaks."""
        try:
            for message in request_iterator:
                if message.WhichOneof("kind") != "report":
                    self._registry.fail(
                        session, grpc.StatusCode.INVALID_ARGUMENT, "only TelemetryReports may follow the Hello"
                    )
                    return
                self._metrics.reports.inc()
                try:
                    self._registry.report(session, message.report)
                except ValueError as exc:
                    self._registry.fail(session, grpc.StatusCode.INVALID_ARGUMENT, f"bad report: {exc}")
                    return
                except SessionEnded:
                    return
        except grpc.RpcError:
            pass  # the client went away; the done-callback marks it disconnected
        finally:
            self._registry.disconnect(session)
