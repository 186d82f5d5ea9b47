"""Fixtures: a fake dataplane (real gRPC) and gateways served by uvicorn on a
free port in a background thread (real HTTP)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from tokenizers import Tokenizer

from gateway.config import GatewaySettings
from tests.gateway.fake_dataplane import FakeDataplane, build_tokenizer
from tests.gateway.harness import RunningGateway


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return build_tokenizer()


@pytest.fixture
def dataplane(tokenizer: Tokenizer) -> Iterator[FakeDataplane]:
    fake = FakeDataplane(tokenizer)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def make_gateway(dataplane: FakeDataplane) -> Iterator[Callable[..., RunningGateway]]:
    """Starts a gateway against the fake dataplane (settings overridable)."""
    started: list[RunningGateway] = []

    def make(**overrides) -> RunningGateway:
        settings = GatewaySettings(**{"dataplane": dataplane.address, "dataplane_wait_s": 5.0, **overrides})
        gateway = RunningGateway(settings).start()
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        gateway.stop()


@pytest.fixture
def gateway(make_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    return make_gateway()
