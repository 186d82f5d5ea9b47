"""`python -m gateway` starts, prints its URL and serves (real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.__main__ import parse_settings

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30


def test_cli_serves_and_prints_url(dataplane):
    env = {**os.environ, "PAGEDWEIGHT_GATEWAY_API_KEYS": "from-env"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--port", "0", "--dataplane", dataplane.address,
         "--api-key", "from-flag", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[2]
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-flag"}, timeout=10)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake-moe"
        # The flag replaced the environment's key list.
        env_key = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-env"}, timeout=10)
        assert env_key.status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=START_TIMEOUT_S)


def test_cli_rejects_bad_settings(capsys):
    with pytest.raises(SystemExit) as info:
        parse_settings(["--max-concurrent-requests", "0"])
    assert info.value.code == 2
    assert "max_concurrent_requests" in capsys.readouterr().err


def test_cli_flags_override_environment(monkeypatch):
    monkeypatch.setenv("PAGEDWEIGHT_GATEWAY_PORT", "1234")
    monkeypatch.setenv("PAGEDWEIGHT_GATEWAY_MAX_QUEUED_REQUESTS", "7")
    settings, _ = parse_settings(["--port", "4321", "--dataplane", "dp:1"])
    assert (settings.port, settings.max_queued_requests, settings.dataplane) == (4321, 7, "dp:1")
