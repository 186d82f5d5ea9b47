"""Offline sensitivity table: quality cost of every block at every bitwidth.

File format (``<model folder>/sensitivity.json``, UTF-8 JSON, version 1)::

    {
      "format": "pagedweight-sensitivity",
      "version": 1,
      "model_name": "mixtral-tiny",            # informative, optional
      "units": "activation-weighted squared error",   # informative, optional
      "num_layers": L,
      "num_experts": E,
      "projections": ["gate", "up", "down"],   # exactly this order
      "bits": [0, 2, 3, 4, 6, 8],              # the last axis of cost
      "cost": [[[[c, ...] x 6] x 3] x E] x L   # cost[layer][expert][proj][i]
    }

cost[l][e][p][i] is the quality cost of block (l, e, p) served at bits[i],
relative to the 8-bit ceiling (so normally 0 at 8). Entries must be finite and
>= 0, and non-increasing in bits over the views 2..8 (more bits never cost
more). The bits = 0 entry is the quality cost while the block is host-only:
the dataplane serves such a block at the master view (fetched for each use),
so profiles write the 8-bit cost there (0); the fetch stall is charged
separately by the planner. (Profiles before session 53 wrote cost(2), when a
fetched block stayed resident at the lowest view; they still load and price
host-only that much higher.) Larger files may later move to safetensors; the JSON stays the
reference.

The dataplane reads this file from its model folder and sends it in its
Hello (telemetry.proto SensitivityTable; controlplane/convert.py validates
it); the controlplane never reads the dataplane's disk. When the dataplane
sends no table the controlplane uses the fallback error model
(``fallback_table``; the table's ``is_fallback`` is True and its ``source``
says why, shown in the Admin status): uniform quantization noise of a
unit-range weight, step^2/12 with step = 2^-bits, summed over the block:

    cost(b) = size * (4^-b - 4^-8) / 12       for b in 2..8
    cost(0) = cost(8) = 0                      (served at the master view)

with size = the block's footprint in bytes at its largest bitwidth (a proxy
for its number of weights, from the dataplane's Hello).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT_NAME = "pagedweight-sensitivity"
FORMAT_VERSION = 1
SENSITIVITY_FILE = "sensitivity.json"
# The table's last axis: bitwidths, 0 = host-only.
BITS_AXIS = (0, 2, 3, 4, 6, 8)
PROJECTIONS = ("gate", "up", "down")
CEILING_BITS = 8
# Uniform quantization noise variance of a unit step is 1/12.
UNIFORM_NOISE_VARIANCE = 1.0 / 12.0
# Costs may fall by float noise when they should stay equal.
MONOTONE_TOLERANCE = 1e-9


class SensitivityError(ValueError):
    """A sensitivity table is malformed or does not fit the model."""


@dataclass(frozen=True)
class SensitivityTable:
    """cost: [num_layers, num_experts, 3, len(BITS_AXIS)] float64."""

    cost: np.ndarray
    source: str  # file path, or "fallback: <reason>"
    is_fallback: bool

    @property
    def num_layers(self) -> int:
        return int(self.cost.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.cost.shape[1])

    def at(self, layer: int, expert: int, proj: int, bits: int) -> float:
        """Cost of block (layer, expert, proj) at bits (one of BITS_AXIS)."""
        return float(self.cost[layer, expert, proj, BITS_AXIS.index(bits)])


def validate_cost(cost: np.ndarray, num_layers: int | None = None, num_experts: int | None = None) -> None:
    """Raises SensitivityError unless cost is a valid table (see module doc)."""
    if cost.ndim != 4 or cost.shape[2:] != (len(PROJECTIONS), len(BITS_AXIS)):
        raise SensitivityError(
            f"cost must be [layers, experts, {len(PROJECTIONS)}, {len(BITS_AXIS)}], got {list(cost.shape)}"
        )
    if num_layers is not None and cost.shape[0] != num_layers:
        raise SensitivityError(f"table has {cost.shape[0]} layers, model has {num_layers}")
    if num_experts is not None and cost.shape[1] != num_experts:
        raise SensitivityError(f"table has {cost.shape[1]} experts, model has {num_experts}")
    if cost.shape[0] == 0 or cost.shape[1] == 0:
        raise SensitivityError("table is empty")
    if not np.all(np.isfinite(cost)) or np.any(cost < 0.0):
        raise SensitivityError("costs must be finite and >= 0")
    views = cost[..., 1:]  # [L, E, 3, views] ascending bits
    if np.any(np.diff(views, axis=-1) > MONOTONE_TOLERANCE * (1.0 + np.abs(views[..., :-1]))):
        raise SensitivityError("costs must not increase with bits (over the views 2..8)")


def table_from_dict(doc: dict, source: str) -> SensitivityTable:
    """Parses and validates the JSON document of the module doc."""
    if doc.get("format") != FORMAT_NAME:
        raise SensitivityError(f"format must be {FORMAT_NAME!r}")
    if doc.get("version") != FORMAT_VERSION:
        raise SensitivityError(f"unsupported version {doc.get('version')!r} (expected {FORMAT_VERSION})")
    if list(doc.get("projections", [])) != list(PROJECTIONS):
        raise SensitivityError(f"projections must be {list(PROJECTIONS)}")
    if list(doc.get("bits", [])) != list(BITS_AXIS):
        raise SensitivityError(f"bits must be {list(BITS_AXIS)}")
    try:
        cost = np.asarray(doc["cost"], dtype=np.float64)
        num_layers, num_experts = int(doc["num_layers"]), int(doc["num_experts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SensitivityError(f"bad cost array or shape fields: {exc}") from exc
    validate_cost(cost, num_layers, num_experts)
    return SensitivityTable(cost=cost, source=source, is_fallback=False)


def table_to_dict(table: SensitivityTable, model_name: str = "", units: str = "") -> dict:
    """The JSON document of a table (inverse of table_from_dict)."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "model_name": model_name,
        "units": units,
        "num_layers": table.num_layers,
        "num_experts": table.num_experts,
        "projections": list(PROJECTIONS),
        "bits": list(BITS_AXIS),
        "cost": table.cost.tolist(),
    }


@dataclass(frozen=True)
class TableDocument:
    """A table file with its informative fields."""

    table: SensitivityTable
    units: str
    model_name: str


def read_document(path: str | Path) -> TableDocument:
    """Reads a table file; raises SensitivityError (or OSError) when unusable."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SensitivityError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SensitivityError(f"{path}: top level must be an object")
    table = table_from_dict(doc, source=str(path))
    return TableDocument(table, str(doc.get("units", "")), str(doc.get("model_name", "")))


def load(path: str | Path) -> SensitivityTable:
    """Reads a table file; raises SensitivityError (or OSError) when unusable."""
    return read_document(path).table


def save(table: SensitivityTable, path: str | Path, model_name: str = "", units: str = "") -> None:
    """Writes a table atomically (temp file + rename) after validating it."""
    validate_cost(table.cost)
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(table_to_dict(table, model_name, units)), encoding="utf-8")
    tmp.replace(path)


def fallback_table(
    num_layers: int, num_experts: int, block_sizes: tuple[float, float, float], reason: str
) -> SensitivityTable:
    """The fallback error model of the module doc; block_sizes per projection
    (gate, up, down)."""
    view_bits = np.asarray(BITS_AXIS[1:], dtype=np.float64)  # [views]
    per_unit = (4.0 ** -view_bits - 4.0 ** -CEILING_BITS) * UNIFORM_NOISE_VARIANCE  # [views]
    per_unit = np.concatenate([per_unit[-1:], per_unit])  # [bits]: host-only = the master view
    sizes = np.asarray(block_sizes, dtype=np.float64)  # [3]
    cost = np.broadcast_to(
        sizes[:, None] * per_unit[None, :], (num_layers, num_experts, len(PROJECTIONS), len(BITS_AXIS))
    ).copy()  # [L, E, 3, bits]
    return SensitivityTable(cost=cost, source=f"fallback: {reason}", is_fallback=True)
