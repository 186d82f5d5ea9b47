"""The sensitivity table travels in the Hello: the dataplane reads it from its
model folder, the controlplane validates it against the announced shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from controlplane import sensitivity
from controlplane.convert import table_for_hello, table_from_proto
from controlplane.planner import ModelShape
from dataplane.precision.sensitivity_message import load_hello_sensitivity
from pagedweight.v1 import telemetry_pb2

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
FOOTPRINT = {0: 0, 2: 10, 3: 15, 4: 20, 6: 30, 8: 40}


def shape(layers: int, experts: int) -> ModelShape:
    return ModelShape(layers, experts, 2, (2, 3, 4, 6, 8), (FOOTPRINT,) * 3)


def test_default_model_table_round_trips_through_the_hello():
    got = load_hello_sensitivity(str(DEFAULT_MODEL))
    assert got.error == "" and got.table is not None
    doc = sensitivity.read_document(DEFAULT_MODEL / sensitivity.SENSITIVITY_FILE)
    msg = got.table
    assert msg.source.endswith(str(DEFAULT_MODEL / sensitivity.SENSITIVITY_FILE)) and msg.units == doc.units
    assert (msg.num_layers, msg.num_experts, msg.num_projections) == doc.table.cost.shape[:3]
    wire = telemetry_pb2.Hello.FromString(telemetry_pb2.Hello(sensitivity=msg).SerializeToString())
    table = table_from_proto(wire.sensitivity, shape(msg.num_layers, msg.num_experts))
    np.testing.assert_array_equal(table.cost, doc.table.cost)
    assert not table.is_fallback and table.source == msg.source


def test_table_of_another_model_shape_is_rejected():
    msg = load_hello_sensitivity(str(DEFAULT_MODEL)).table
    with pytest.raises(ValueError, match="layers"):
        table_from_proto(msg, shape(msg.num_layers + 1, msg.num_experts))


def test_missing_or_invalid_file_sends_no_table_and_says_why(tmp_path):
    missing = load_hello_sensitivity(str(tmp_path))
    assert missing.table is None and "not found" in missing.error
    (tmp_path / sensitivity.SENSITIVITY_FILE).write_text("{not json")
    broken = load_hello_sensitivity(str(tmp_path))
    assert broken.table is None and "invalid" in broken.error
    assert load_hello_sensitivity("").table is None  # synthetic model: no folder
    hello = telemetry_pb2.Hello(sensitivity_error=broken.error)
    fallback = table_for_hello(hello, shape(2, 4))
    assert fallback.is_fallback and fallback.source == f"fallback: {broken.error}"
