"""A gateway served by uvicorn on a free port in a background thread (real
HTTP), for tests, and a scrape of its /metrics."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from gateway.__main__ import bind
from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.dataplane_client import GrpcDataplaneClient

CLIENT_TIMEOUT_S = 20.0


class RunningGateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        client = GrpcDataplaneClient(settings.dataplane, wait_s=settings.dataplane_wait_s)
        self.app = create_app(settings, client)
        self._sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> RunningGateway:
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return self
            self._thread.join(timeout=0.01)
        raise RuntimeError("gateway did not start")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def openai(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        """The official client, without retries (tests look at single answers)."""
        options = {"max_retries": 0, "timeout": CLIENT_TIMEOUT_S, **kwargs}
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, **options)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """All samples of /metrics as {(name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
