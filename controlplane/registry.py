"""Registered dataplanes and the plans sent to them: the in-process core
behind the Telemetry and Admin gRPC services (tests drive it directly).

One DataplaneRecord per dataplane id, kept after a disconnect so that status
and GetPlan still answer. A connection is a Session; a new Hello with the
same id supersedes the previous session (its stream ends), so a dataplane
that reconnects before the old stream is noticed dead is not locked out.

Plans are computed by the stream's own thread in wait_plan: a record becomes
*dirty* when an input of its plan moves (first connection, floors/pins/budget,
the first reported bits or bits below a floor, an activity shift above the
threshold; not the dataplane's own walk, which its complete plan covers), and
wait_plan returns a fresh plan once the record is dirty and at least
plan_min_interval_s passed since the previous plan (the first plan of a
session goes out at once). Thread-safe: one condition guards every record.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np

from controlplane import sensitivity
from controlplane.activity import ActivityTable, normalize_rows
from controlplane.config import ControlplaneConfig
from controlplane.metrics import DataplaneGauges
from controlplane.convert import (
    block_bits_from_report,
    full_precision_bits,
    ladder_to_plan,
    shape_from_hello,
    table_for_hello,
)
from controlplane.planner import Constraints, Ladder, ModelShape, PlanInputs, build_ladder, expert_importance
from controlplane.store import AdminStore
from pagedweight.v1 import admin_pb2, telemetry_pb2

log = logging.getLogger(__name__)


class SessionEnded(Exception):
    """The session is over (disconnected, superseded, or server closing)."""


class SessionFailed(Exception):
    """The dataplane broke the protocol; end its stream with this status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Session:
    dataplane_id: str
    session_id: str


@dataclass
class DataplaneRecord:
    hello: telemetry_pb2.Hello
    shape: ModelShape
    table: sensitivity.SensitivityTable
    activity: ActivityTable
    session_id: str
    registered_at: float
    current_bits: np.ndarray  # [L, E, 3] last reported (full precision before any)
    bits_reported: bool = False  # False: current_bits is the full-precision assumption
    connected: bool = True
    error: SessionFailed | None = None
    last_report: telemetry_pb2.TelemetryReport | None = None
    last_report_at: float | None = None
    dirty: bool = True
    last_plan: telemetry_pb2.PrecisionPlan | None = None
    last_ladder: Ladder | None = None
    last_plan_at: float = -math.inf
    plan_basis_bits: np.ndarray | None = None  # current_bits the last plan started from
    plan_basis_reported: bool = False  # the last plan started from reported bits, not the assumption
    plan_importance: np.ndarray | None = None  # [L, E] importance rows (sum 1) of the last plan


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """Largest per-layer total variation distance of two [L, E] row
    distributions."""
    return float(0.5 * np.abs(a - b).sum(axis=1).max())


class DataplaneRegistry:
    """Contract: register -> (report | wait_plan)* -> disconnect, per
    session; every method is safe to call from any thread."""

    def __init__(self, store: AdminStore, cfg: ControlplaneConfig, clock: Callable[[], float] = time.monotonic):
        self._store = store
        self._cfg = cfg
        self._clock = clock
        self._cond = threading.Condition()
        self._records: dict[str, DataplaneRecord] = {}
        self._closed = False

    # -- sessions ------------------------------------------------------------
    def register(self, hello: telemetry_pb2.Hello) -> Session:
        """Validates a Hello (ValueError) and opens a session for it."""
        shape = shape_from_hello(hello)
        table = table_for_hello(hello, shape)
        if table.is_fallback:
            log.warning("dataplane %s: planning with the fallback error model (%s)", hello.dataplane_id, table.source)
        session = Session(hello.dataplane_id, uuid.uuid4().hex)
        with self._cond:
            old = self._records.get(hello.dataplane_id)
            keep_activity = old is not None and old.shape == shape
            self._records[hello.dataplane_id] = DataplaneRecord(
                hello=hello,
                shape=shape,
                table=table,
                activity=old.activity if keep_activity else ActivityTable(
                    shape.num_layers, shape.num_experts, self._cfg.activity_half_life_s
                ),
                session_id=session.session_id,
                registered_at=self._clock(),
                current_bits=full_precision_bits(shape),
                last_plan=old.last_plan if old is not None else None,
            )
            self._cond.notify_all()
        return session

    def _live(self, session: Session) -> DataplaneRecord | None:
        rec = self._records.get(session.dataplane_id)
        return rec if rec is not None and rec.session_id == session.session_id else None

    def report(self, session: Session, report: telemetry_pb2.TelemetryReport) -> None:
        """Folds a report in; ValueError on a shape mismatch (nothing kept)."""
        with self._cond:
            rec = self._live(session)
            if rec is None:
                raise SessionEnded()
            bits = block_bits_from_report(report, rec.shape)
            rec.activity.update(
                report.window_ms, report.routed_tokens, report.router_prob_mass, report.running_demand
            )
            rec.last_report = report
            rec.last_report_at = self._clock()
            if bits is not None:
                rec.current_bits = bits
                rec.bits_reported = True
            if self._plan_inputs_moved(rec):
                rec.dirty = True
                self._cond.notify_all()

    def _plan_inputs_moved(self, rec: DataplaneRecord) -> bool:
        if rec.plan_basis_bits is None or rec.plan_importance is None:
            return True
        if self._bits_need_plan(rec):
            return True
        now = normalize_rows(expert_importance(rec.activity.snapshot(), self._cfg.planner))
        return total_variation(now, rec.plan_importance) > self._cfg.activity_shift_threshold

    @staticmethod
    def _bits_need_plan(rec: DataplaneRecord) -> bool:
        """Whether the reported bits call for a new plan. The dataplane's own
        walk does not: the plan's lists are complete (planner.py), so they
        hold every rung it can take from any bits it walked to, and
        re-planning would only make the engine thread adopt the same ladder
        again. A new plan is needed when the last one started from the
        full-precision assumption (no report yet) or a block fell below the
        floor it was planned with (its correction is a mandatory rung; blocks
        already below it at the plan's start have theirs in that plan)."""
        if np.array_equal(rec.current_bits, rec.plan_basis_bits):
            return False
        if not rec.plan_basis_reported or rec.last_ladder is None:
            return True
        floor = rec.last_ladder.floor_bits  # [L, E, 3]
        return bool(np.any((rec.current_bits < floor) & (rec.plan_basis_bits >= floor)))

    def fail(self, session: Session, code: grpc.StatusCode, message: str) -> None:
        """Marks the session broken; its wait_plan raises SessionFailed."""
        with self._cond:
            rec = self._live(session)
            if rec is not None and rec.error is None:
                rec.error = SessionFailed(code, message)
                self._cond.notify_all()

    def disconnect(self, session: Session) -> None:
        """The session's stream is gone (idempotent)."""
        with self._cond:
            rec = self._live(session)
            if rec is not None:
                rec.connected = False
                self._cond.notify_all()

    def close(self) -> None:
        """Ends every session's wait (server shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- plans ---------------------------------------------------------------
    def inputs_changed(self, dataplane_id: str | None = None) -> None:
        """Admin state moved: re-plan one dataplane (or all when None/'')."""
        with self._cond:
            for dp_id, rec in self._records.items():
                if not dataplane_id or dp_id == dataplane_id:
                    rec.dirty = True
            self._cond.notify_all()

    def wait_plan(self, session: Session, timeout_s: float) -> telemetry_pb2.PrecisionPlan | None:
        """Blocks up to timeout_s for the session's next plan; None on
        timeout. Raises SessionFailed / SessionEnded when the stream must end."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                rec = self._live(session)
                if rec is not None and rec.error is not None:
                    raise rec.error
                if self._closed or rec is None or not rec.connected:
                    raise SessionEnded()
                now = self._clock()
                ready_at = rec.last_plan_at + self._cfg.plan_min_interval_s if rec.dirty else math.inf
                if ready_at <= now:
                    break
                if now >= deadline:
                    return None
                self._cond.wait(min(ready_at, deadline) - now)
            rec.dirty = False
            rec.last_plan_at = now
            basis_reported = rec.bits_reported
            inputs = PlanInputs(
                shape=rec.shape,
                sensitivity=rec.table,
                activity=rec.activity.snapshot(),
                current_bits=rec.current_bits.copy(),
                constraints=Constraints(
                    floors=tuple(self._store.floors()),
                    pins=tuple(self._store.pins()),
                    budget_bytes=self._store.budget_for(session.dataplane_id),
                ),
            )
        ladder = build_ladder(inputs, self._cfg.planner)  # outside the lock: may take a while
        plan = ladder_to_plan(ladder, self._store.next_plan_id(), self._cfg.planner)
        with self._cond:
            rec = self._live(session)
            if rec is None:
                raise SessionEnded()
            rec.last_plan, rec.last_ladder = plan, ladder
            rec.plan_basis_bits = inputs.current_bits
            rec.plan_basis_reported = basis_reported
            rec.plan_importance = normalize_rows(expert_importance(inputs.activity, self._cfg.planner))
        return plan

    # -- queries -------------------------------------------------------------
    def get_plan(self, dataplane_id: str) -> telemetry_pb2.PrecisionPlan:
        """The latest plan sent; KeyError when the id is unknown or has none."""
        with self._cond:
            rec = self._records.get(dataplane_id)
            if rec is None:
                raise KeyError(f"unknown dataplane {dataplane_id!r}")
            if rec.last_plan is None:
                raise KeyError(f"no plan sent to dataplane {dataplane_id!r} yet")
            return rec.last_plan

    def shapes(self) -> list[ModelShape]:
        """Shapes of every known dataplane."""
        with self._cond:
            return [rec.shape for rec in self._records.values()]

    def gauges(self) -> list[DataplaneGauges]:
        """What /metrics shows of every known dataplane (controlplane/metrics.py)."""
        with self._cond:
            return [
                DataplaneGauges(
                    dataplane_id=dp_id,
                    connected=rec.connected,
                    predicted_quality_cost=rec.last_report.predicted_quality_cost if rec.last_report else 0.0,
                    plan_predicted_budget_cost=rec.last_ladder.predicted_budget_cost if rec.last_ladder else 0.0,
                    demotion_rungs=len(rec.last_plan.demotions) if rec.last_plan is not None else 0,
                    promotion_rungs=len(rec.last_plan.promotions) if rec.last_plan is not None else 0,
                    sensitivity_fallback=rec.table.is_fallback,
                )
                for dp_id, rec in sorted(self._records.items())
            ]

    def statuses(self) -> list[admin_pb2.DataplaneStatus]:
        """Every known dataplane's status, by id."""
        with self._cond:
            return [self._status(dp_id, rec) for dp_id, rec in sorted(self._records.items())]

    def _status(self, dp_id: str, rec: DataplaneRecord) -> admin_pb2.DataplaneStatus:
        report = rec.last_report
        arena = report.engine.arena if report is not None else None
        since = rec.last_report_at if rec.last_report_at is not None else rec.registered_at
        status = admin_pb2.DataplaneStatus(
            dataplane_id=dp_id,
            connected=rec.connected,
            model_name=rec.hello.model_name,
            num_layers=rec.shape.num_layers,
            num_experts=rec.shape.num_experts,
            block_bits=rec.current_bits.reshape(-1).tolist() if rec.bits_reported else [],
            predicted_quality_cost=report.predicted_quality_cost if report is not None else 0.0,
            free_pages=arena.free_pages if arena is not None else 0,
            total_pages=arena.total_pages if arena is not None else 0,
            activity=rec.activity.snapshot().routed_share.reshape(-1).tolist(),
            seconds_since_report=max(0.0, self._clock() - since),
            plan_id=rec.last_plan.plan_id if rec.last_plan is not None else 0,
            expert_budget_bytes=self._store.budget_for(dp_id),
            sensitivity_source=rec.table.source,
            sensitivity_fallback=rec.table.is_fallback,
            budget_feasible=rec.last_ladder.budget_feasible if rec.last_ladder is not None else True,
            budget_anchor=rec.last_ladder.budget_anchor if rec.last_ladder is not None else "",
            plan_predicted_budget_cost=rec.last_ladder.predicted_budget_cost if rec.last_ladder is not None else 0.0,
        )
        if report is not None:
            status.engine.CopyFrom(report.engine)
        return status
