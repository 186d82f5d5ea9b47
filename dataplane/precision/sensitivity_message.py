"""The sensitivity table the dataplane sends in its Hello.

The table lives beside the model (``<model folder>/sensitivity.json``, format
in controlplane/sensitivity.py, written by dataplane/profiling/). The
dataplane reads it once and sends it in the Hello, so the controlplane never
needs the dataplane's filesystem. A missing or invalid file is not fatal:
the Hello then carries no table and says why (``sensitivity_error``), and
the controlplane plans with its fallback error model.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from controlplane.sensitivity import (
    BITS_AXIS,
    FORMAT_VERSION,
    PROJECTIONS,
    SENSITIVITY_FILE,
    SensitivityError,
    TableDocument,
    read_document,
)
from pagedweight.v1 import telemetry_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HelloSensitivity:
    """What goes into the Hello: the table, or why there is none."""

    table: telemetry_pb2.SensitivityTable | None
    error: str  # empty when table is set


def table_to_proto(doc: TableDocument, source: str) -> telemetry_pb2.SensitivityTable:
    """The Hello's SensitivityTable of a table file."""
    table = doc.table
    return telemetry_pb2.SensitivityTable(
        source=source,
        format_version=FORMAT_VERSION,
        units=doc.units,
        model_name=doc.model_name,
        num_layers=table.num_layers,
        num_experts=table.num_experts,
        num_projections=len(PROJECTIONS),
        bits=list(BITS_AXIS),
        cost=table.cost.reshape(-1).tolist(),  # row-major [L, E, 3, bits]
    )


def load_hello_sensitivity(model_path: str) -> HelloSensitivity:
    """Reads ``<model_path>/sensitivity.json`` (never raises; logs why a
    table is missing)."""
    if not model_path:
        return HelloSensitivity(None, "no model folder (synthetic model)")
    path = Path(model_path) / SENSITIVITY_FILE
    if not path.is_file():
        error = f"{path} not found"
    else:
        try:
            doc = read_document(path)
        except (SensitivityError, OSError) as exc:
            error = f"{path} invalid: {exc}"
        else:
            return HelloSensitivity(table_to_proto(doc, f"{socket.gethostname()}:{path}"), "")
    log.warning("no sensitivity table for the controlplane (%s): it will plan with its fallback error model", error)
    return HelloSensitivity(None, error)
