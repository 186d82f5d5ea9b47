"""Fixtures of the controlplane tests: a live in-process server on a free
port with its SQLite file in tmp_path, an authenticated Admin stub, and fake
dataplanes speaking the Telemetry stream."""

from __future__ import annotations

from typing import Iterator

import grpc
import pytest

from controlplane.server import ControlplaneServer
from pagedweight.v1 import admin_pb2_grpc
from tests.controlplane.cp_helpers import TOKEN, FakeDataplane, make_config


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "cp.sqlite3"


@pytest.fixture
def server(db_path) -> Iterator[ControlplaneServer]:
    srv = ControlplaneServer(make_config(db_path)).start()
    yield srv
    srv.stop(grace_s=0)


@pytest.fixture
def admin(server):
    """(stub, metadata) of an authenticated Admin client."""
    channel = grpc.insecure_channel(server.address)
    yield admin_pb2_grpc.AdminStub(channel), (("authorization", f"Bearer {TOKEN}"),)
    channel.close()


@pytest.fixture
def dataplanes(server):
    """Factory of FakeDataplanes connected to the server; all closed after."""
    made: list[FakeDataplane] = []

    def connect() -> FakeDataplane:
        dp = FakeDataplane(server.address)
        made.append(dp)
        return dp

    yield connect
    for dp in made:
        dp.close()
