"""Unit tests of the store, the activity table and the sensitivity format."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from controlplane import sensitivity
from controlplane.activity import ActivityTable
from controlplane.store import AdminStore, Floor, Pin, StoreError

L, E = 2, 3


def test_store_round_trip_and_order(tmp_path):
    store = AdminStore(tmp_path / "a.db")
    store.set_floor(Floor(1, 2, 4))
    store.set_floor(Floor(None, None, 3))
    store.set_floor(Floor(0, None, 6))
    store.set_floor(Floor(None, None, 8))  # replaces the model floor
    assert store.floors() == [Floor(None, None, 8), Floor(0, None, 6), Floor(1, 2, 4)]
    with pytest.raises(ValueError):
        store.set_floor(Floor(None, 1, 4))
    assert store.clear_floor(0, None) and not store.clear_floor(0, None)
    store.set_pin(Pin(3, 1, 2))
    store.set_pin(Pin(0, 5, 0))
    assert store.pins() == [Pin(0, 5, 0), Pin(3, 1, 2)]
    ids = [store.next_plan_id() for _ in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    store.close()
    reopened = AdminStore(tmp_path / "a.db")
    assert reopened.floors() == [Floor(None, None, 8), Floor(1, 2, 4)]
    assert reopened.next_plan_id() == ids[-1] + 1  # plan ids keep growing across restarts
    assert reopened.budget_for("x") == 0
    reopened.close()


def test_store_refuses_newer_schema(tmp_path):
    path = tmp_path / "b.db"
    AdminStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO schema_version VALUES (99)")
    with pytest.raises(StoreError):
        AdminStore(path)


def test_activity_decays_by_half_life():
    table = ActivityTable(L, E, half_life_s=1.0)
    table.update(0, np.array([10, 0, 0, 0, 0, 10]), np.array([4.0, 0, 0, 0, 0, 4.0]), None)
    table.update(1000, np.array([0, 10, 0, 0, 0, 10]), None, np.array([0, 0, 1.0, 0, 0, 0]))
    snap = table.snapshot()
    # Layer 0: the first window weighs 0.5 after one half-life.
    np.testing.assert_allclose(snap.routed_share[0], [5 / 15, 10 / 15, 0])
    np.testing.assert_allclose(snap.routed_share[1], [0, 0, 1])
    np.testing.assert_allclose(snap.prob_share[0], [1, 0, 0])
    np.testing.assert_allclose(snap.demand_share, [[0, 0, 1], [1 / 3, 1 / 3, 1 / 3]])
    assert snap.has_demand
    with pytest.raises(ValueError):
        table.update(100, np.ones(L * E + 1), None, None)
    with pytest.raises(ValueError):
        table.update(100, None, np.full(L * E, np.nan), None)
    assert table.reports == 2  # failed updates changed nothing


def test_activity_uniform_before_data():
    snap = ActivityTable(L, E, 10.0).snapshot()
    np.testing.assert_allclose(snap.routed_share, 1 / E)
    assert not snap.has_demand and snap.running_seqs == 0.0


def test_running_seqs_counts_the_demand_distributions():
    # Each running sequence adds one routing distribution (a row summing to 1
    # per layer) to the demand: three sequences here.
    table = ActivityTable(L, E, 10.0)
    demand = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]).sum(axis=0)  # one layer's three rows
    table.update(10, None, None, np.concatenate([demand, demand[::-1]]))
    assert table.snapshot().running_seqs == pytest.approx(3.0)


def make_cost() -> np.ndarray:
    cost = np.zeros((L, E, 3, len(sensitivity.BITS_AXIS)))
    cost[..., 1:] = np.linspace(4, 0, 5)
    cost[..., 0] = 4.0
    return cost


def test_sensitivity_save_load_round_trip(tmp_path):
    table = sensitivity.SensitivityTable(make_cost(), "", False)
    path = tmp_path / sensitivity.SENSITIVITY_FILE
    sensitivity.save(table, path, model_name="m", units="mse")
    loaded = sensitivity.load(path)
    np.testing.assert_array_equal(loaded.cost, table.cost)
    assert not loaded.is_fallback and loaded.source == str(path)
    assert loaded.at(1, 2, 0, 3) == pytest.approx(3.0)
    doc = sensitivity.read_document(path)
    assert (doc.model_name, doc.units) == ("m", "mse")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(bits=[0, 2, 4, 3, 6, 8]), "bits"),
    (lambda d: d.update(num_experts=E + 1), "experts"),
    (lambda d: d["cost"][0][0][0].__setitem__(5, 9.0), "increase"),
    (lambda d: d["cost"][0][0][0].__setitem__(1, -1.0), ">= 0"),
])
def test_sensitivity_validation(tmp_path, mutate, message):
    doc = sensitivity.table_to_dict(sensitivity.SensitivityTable(make_cost(), "", False))
    mutate(doc)
    path = tmp_path / sensitivity.SENSITIVITY_FILE
    path.write_text(json.dumps(doc))
    with pytest.raises(sensitivity.SensitivityError, match=message):
        sensitivity.load(path)


def test_sensitivity_fallback_model():
    table = sensitivity.fallback_table(L, E, (100.0, 100.0, 200.0), "no table")
    assert table.is_fallback and table.source == "fallback: no table"
    assert table.at(0, 0, 0, 8) == 0.0
    # 4^-bits error model: each bit less costs about 4x more.
    assert table.at(0, 0, 0, 2) / table.at(0, 0, 0, 3) == pytest.approx(4.0, rel=0.01)
    assert table.at(1, 1, 2, 4) == pytest.approx(2 * table.at(1, 1, 0, 4))  # proportional to block size
    assert table.at(0, 0, 0, 0) == table.at(0, 0, 0, 8) == 0.0  # host-only is served at the master view
    sensitivity.validate_cost(table.cost, L, E)
