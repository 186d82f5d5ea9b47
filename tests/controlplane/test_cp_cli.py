"""`python -m controlplane` and `python -m controlplane.cli` as subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane.cp_helpers import TOKEN, FakeDataplane, make_hello

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30


@pytest.fixture
def live_server(tmp_path):
    """A controlplane process on a free port; yields its address."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "--port", "0", "--db", str(tmp_path / "cp.db"),
         "--admin-token", TOKEN, "--log-level", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"serving on (\S+:\d+)", line)
    assert match, f"unexpected startup output {line!r}: {proc.stderr.read() if proc.poll() is not None else ''}"
    yield match.group(1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=START_TIMEOUT_S) == 0


def cli(address: str, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "--address", address, "--token", token, *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=START_TIMEOUT_S,
    )


def test_cli_against_live_server(live_server):
    ok = cli(live_server, "set-floor", "--bits", "4", "--layer", "1")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"scope": {"layer": 1}, "min_bits": 4}
    assert cli(live_server, "pin", "--layer", "0", "--expert", "2", "--bits", "6").returncode == 0

    dp = FakeDataplane(live_server)
    try:
        dp.hello(make_hello())
        dp.recv()
        plan = dp.recv_plan()
        shown = cli(live_server, "plan", "--dataplane", "dp-1")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert int(doc["plan_id"]) == plan.plan_id and len(doc["demotions"]) == len(plan.demotions)
        status = json.loads(cli(live_server, "status").stdout)
        assert status["num_floors"] == 1 and status["num_pins"] == 1
        assert status["dataplanes"][0]["dataplane_id"] == "dp-1" and status["dataplanes"][0]["connected"]
    finally:
        dp.close()

    missing = cli(live_server, "clear-floor", "--layer", "5")
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stderr
    bad = cli(live_server, "set-floor", "--bits", "5")
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr
    denied = cli(live_server, "floors", token="nope")
    assert denied.returncode != 0 and "UNAUTHENTICATED" in denied.stderr
