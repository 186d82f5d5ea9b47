"""End to end: one process of the real stack is killed (SIGKILL) while a
request streams; the supervisor (launcher/supervisor.py, run the way the
launcher runs it) restarts only that process, and the others' requests go on.
A killed dataplane's requests too: the gateway continues them on the
restarted one (gateway/resume.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import grpc
import httpx
import openai
import pytest

from launcher.processes import DEFAULT_MODEL, Stack, loopback_stack_config
from launcher.supervisor import RestartPolicy, Supervisor
from pagedweight.v1 import admin_pb2, admin_pb2_grpc

from e2e_stack import ADMIN_TOKEN, TELEMETRY_INTERVAL_MS, print_logs

TIMEOUT_S = 120.0
RECOVERY_S = 120.0
WATCH_INTERVAL_S = 0.1
POLICY = RestartPolicy(max_restarts=3, window_s=600.0, initial_backoff_s=0.2, max_backoff_s=1.0)
STREAM_TOKENS = 200
PROMPT = "def parse(text):\n"
AUTH = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The e2e stack, its gateway waiting as long for a restarting dataplane
    as this module waits for any recovery (a loaded CI machine restarts slowly)."""
    root = tmp_path_factory.mktemp("stack")
    cfg = loopback_stack_config(DEFAULT_MODEL, root, ADMIN_TOKEN, TELEMETRY_INTERVAL_MS)
    cfg.extra_gateway_args = ["--dataplane-wait-s", str(RECOVERY_S)]
    running = Stack(cfg)
    running.start()
    yield running
    running.stop()
    print_logs(root)


@pytest.fixture(scope="module")
def supervisor(stack):
    lines: list[str] = []
    running = Supervisor(stack, POLICY, log=lines.append)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            assert running.check() is None, lines

    thread = threading.Thread(target=watch, name="supervisor", daemon=True)
    thread.start()
    yield running
    stop.set()
    thread.join(timeout=RECOVERY_S)
    print("\n".join(lines))


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def model_name(stack) -> str:
    return client(stack).models.list().data[0].id


def open_stream(stack):
    """A streamed text completion of STREAM_TOKENS tokens whose first token has arrived."""
    stream = client(stack).completions.create(
        model=model_name(stack), prompt=PROMPT, max_tokens=STREAM_TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices and first.choices[0].finish_reason is None
    return chunks


def kill(stack, name: str) -> int:
    pid = stack.processes[name].popen.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_until(predicate, what: str, timeout_s: float = RECOVERY_S):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (openai.APIError, grpc.RpcError):
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def restarted(stack, name: str, old_pid: int) -> bool:
    proc = stack.processes.get(name)
    return proc is not None and proc.popen.pid != old_pid and proc.alive()


def completion_works(stack) -> bool:
    reply = client(stack).completions.create(model=model_name(stack), prompt=PROMPT, max_tokens=4)
    return reply.usage.completion_tokens > 0


def dataplane_connected(stack) -> bool:
    with grpc.insecure_channel(stack.cfg.controlplane_address) as channel:
        status = admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(), metadata=AUTH, timeout=10)
    return any(d.connected for d in status.dataplanes)


def test_controlplane_killed_mid_stream_the_stream_completes_and_it_comes_back(stack, supervisor):
    wait_until(lambda: dataplane_connected(stack), "the dataplane registered")
    chunks = open_stream(stack)
    pid = kill(stack, "controlplane")
    rest = list(chunks)
    usage = rest[-1].usage
    assert usage is not None and usage.completion_tokens == STREAM_TOKENS
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
    wait_until(lambda: restarted(stack, "controlplane", pid), "the controlplane restarted")
    wait_until(lambda: dataplane_connected(stack), "the dataplane reconnected to the new controlplane")
    assert completion_works(stack)


def test_gateway_killed_mid_stream_its_request_is_freed_and_it_comes_back(stack, supervisor):
    chunks = open_stream(stack)
    pid = kill(stack, "gateway")
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(chunks)
    wait_until(lambda: restarted(stack, "gateway", pid), "the gateway restarted")
    assert wait_until(lambda: completion_works(stack), "the new gateway served")
    # The dataplane saw the dead gateway's stream end and freed its KV blocks.
    wait_until(lambda: gateway_metric(stack, "pagedweight_engine_kv_blocks_used") == 0,
               "the killed request's KV blocks freed")


def test_dataplane_killed_mid_stream_the_stream_is_continued_on_the_restarted_one(stack, supervisor):
    chunks = open_stream(stack)
    pid = kill(stack, "dataplane")
    rest = list(chunks)  # waits while the supervisor restarts the dataplane
    assert restarted(stack, "dataplane", pid)
    usage = rest[-1].usage
    assert usage is not None and usage.completion_tokens == STREAM_TOKENS
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
    assert gateway_metric(stack, "pagedweight_gateway_sequences_resumed_total") == 1
    assert completion_works(stack)
    wait_until(lambda: dataplane_connected(stack), "the new dataplane registered with the controlplane")


def gateway_metric(stack, name: str) -> float | None:
    """One unlabelled sample of the gateway's /metrics, None when absent."""
    with urllib.request.urlopen(f"{stack.cfg.gateway_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None
