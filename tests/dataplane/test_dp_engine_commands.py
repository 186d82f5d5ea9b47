"""Engine.run_on_engine_thread (dataplane/engine_commands.py): a function
runs on the engine thread, its result or exception comes back to the caller,
and the engine goes on serving after a failed call."""

from __future__ import annotations

import threading

import pytest

from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams

TIMEOUT_S = 60


def test_a_call_runs_on_the_engine_thread_and_returns_its_result(make_engine) -> None:
    engine = make_engine()
    caller = threading.current_thread()
    ran_on = engine.run_on_engine_thread(threading.current_thread)
    assert ran_on is not caller and ran_on.name == "engine"
    assert engine.run_on_engine_thread(lambda: engine.scheduler.has_work()) is False


def test_a_failing_call_raises_in_the_caller_and_the_engine_serves_on(make_engine) -> None:
    engine = make_engine()

    def broken() -> None:
        raise KeyError("no such block")

    with pytest.raises(KeyError, match="no such block"):
        engine.run_on_engine_thread(broken)
    assert engine.error is None
    sink = QueueSink()
    engine.add_request("after", [3, 4, 5], SamplingParams(max_tokens=2, ignore_eos=True), sink)
    assert list(sink.outputs(timeout=TIMEOUT_S))[-1].completion_tokens == 2


def test_a_call_needs_a_running_engine(make_engine) -> None:
    engine = make_engine()
    engine.stop()
    with pytest.raises(RuntimeError, match="not started"):
        engine.run_on_engine_thread(lambda: None)
