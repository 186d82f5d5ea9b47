"""SQLite persistence of the controlplane's admin state.

Holds quality floors, pins, expert-weight memory budgets and the plan-id
counter (so plan ids keep increasing across restarts). One file, WAL mode, a
schema_version table; every write is its own transaction, so a crash loses at
most the call in flight. Thread-safe: the gRPC thread pool shares one store.

Scopes are stored with -1 for "unset" (SQLite treats NULLs in a primary key
as distinct, which would allow duplicate model-wide floors).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
_UNSET = -1

_SCHEMA_V1 = """
CREATE TABLE floors (
    layer INTEGER NOT NULL,      -- -1: every layer
    expert INTEGER NOT NULL,     -- -1: every expert of the scope
    min_bits INTEGER NOT NULL,
    PRIMARY KEY (layer, expert)
);
CREATE TABLE pins (
    layer INTEGER NOT NULL,
    expert INTEGER NOT NULL,
    bits INTEGER NOT NULL,
    PRIMARY KEY (layer, expert)
);
CREATE TABLE budgets (
    dataplane_id TEXT PRIMARY KEY,   -- '': every dataplane without its own
    expert_budget_bytes INTEGER NOT NULL
);
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


@dataclass(frozen=True, order=True)
class Floor:
    """Minimum bits of a scope: layer None = model-wide; expert needs layer."""

    layer: int | None
    expert: int | None
    min_bits: int


@dataclass(frozen=True, order=True)
class Pin:
    """An expert (all its blocks) held at a fixed bitwidth."""

    layer: int
    expert: int
    bits: int


class StoreError(RuntimeError):
    """The database file is unusable (e.g. written by a newer version)."""


def _to_db(value: int | None) -> int:
    return _UNSET if value is None else value


def _from_db(value: int) -> int | None:
    return None if value == _UNSET else value


class AdminStore:
    """Durable floors, pins, budgets. Contract: every method either commits or
    raises; readers see committed state only."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self._path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    @property
    def path(self) -> Path:
        return self._path

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._db.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = row[0] or 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self._path}: schema version {version} is newer than this controlplane "
                    f"({SCHEMA_VERSION})"
                )
            if version < 1:
                try:
                    self._db.executescript("BEGIN;" + _SCHEMA_V1 + "INSERT INTO schema_version VALUES (1); COMMIT;")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, params: tuple) -> int:
        """Runs one statement in its own transaction; returns rows changed."""
        with self._lock:
            cur = self._db.execute(sql, params)
            return cur.rowcount

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- floors --------------------------------------------------------------
    def set_floor(self, floor: Floor) -> Floor:
        """Sets or replaces the floor of floor's scope."""
        if floor.expert is not None and floor.layer is None:
            raise ValueError("an expert floor needs a layer")
        self._write(
            "INSERT INTO floors (layer, expert, min_bits) VALUES (?, ?, ?) "
            "ON CONFLICT (layer, expert) DO UPDATE SET min_bits = excluded.min_bits",
            (_to_db(floor.layer), _to_db(floor.expert), floor.min_bits),
        )
        return floor

    def clear_floor(self, layer: int | None, expert: int | None) -> bool:
        """Removes a scope's floor; False when there was none."""
        return self._write(
            "DELETE FROM floors WHERE layer = ? AND expert = ?", (_to_db(layer), _to_db(expert))
        ) > 0

    def floors(self) -> list[Floor]:
        """Every floor: model-wide first, then by layer (layer-wide before its
        experts) and expert."""
        rows = self._read("SELECT layer, expert, min_bits FROM floors ORDER BY layer, expert")
        return [Floor(_from_db(l), _from_db(e), b) for l, e, b in rows]

    # -- pins ----------------------------------------------------------------
    def set_pin(self, pin: Pin) -> Pin:
        """Sets or replaces the pin of pin's expert."""
        self._write(
            "INSERT INTO pins (layer, expert, bits) VALUES (?, ?, ?) "
            "ON CONFLICT (layer, expert) DO UPDATE SET bits = excluded.bits",
            (pin.layer, pin.expert, pin.bits),
        )
        return pin

    def clear_pin(self, layer: int, expert: int) -> bool:
        """Removes a pin; False when there was none."""
        return self._write("DELETE FROM pins WHERE layer = ? AND expert = ?", (layer, expert)) > 0

    def pins(self) -> list[Pin]:
        """Every pin, by layer and expert."""
        rows = self._read("SELECT layer, expert, bits FROM pins ORDER BY layer, expert")
        return [Pin(l, e, b) for l, e, b in rows]

    # -- budgets -------------------------------------------------------------
    def set_budget(self, dataplane_id: str, expert_budget_bytes: int) -> None:
        """Sets a dataplane's budget ('' = the default of every dataplane);
        0 removes it."""
        if expert_budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        if expert_budget_bytes == 0:
            self._write("DELETE FROM budgets WHERE dataplane_id = ?", (dataplane_id,))
            return
        self._write(
            "INSERT INTO budgets (dataplane_id, expert_budget_bytes) VALUES (?, ?) "
            "ON CONFLICT (dataplane_id) DO UPDATE SET expert_budget_bytes = excluded.expert_budget_bytes",
            (dataplane_id, expert_budget_bytes),
        )

    def budgets(self) -> dict[str, int]:
        """Every stored budget by dataplane id ('' = default)."""
        return dict(self._read("SELECT dataplane_id, expert_budget_bytes FROM budgets"))

    def budget_for(self, dataplane_id: str) -> int:
        """The budget in force for a dataplane: its own, else the default,
        else 0 (none)."""
        budgets = self.budgets()
        return budgets.get(dataplane_id, budgets.get("", 0))

    # -- counters ------------------------------------------------------------
    def next_plan_id(self) -> int:
        """A plan id larger than every id this database handed out before."""
        with self._lock:
            row = self._db.execute(
                "INSERT INTO counters (name, value) VALUES ('plan_id', 1) "
                "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value"
            ).fetchone()
            return row[0]
