"""The supervisor's restart rules, on a stack of fake processes and a fake clock."""

from __future__ import annotations

import pytest

from launcher.__main__ import parse_args
from launcher.processes import DEFAULT_MODEL, Stack, StackConfig
from launcher.supervisor import RestartPolicy, Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStack:
    """Processes are names with an exit code (None: running). A restart of a
    name listed in ``fail_next`` fails, leaving it exited, as Stack.restart does."""

    def __init__(self, names: list[str]) -> None:
        self.codes: dict[str, int | None] = {name: None for name in names}
        self.restarted: list[str] = []
        self.fail_next: set[str] = set()

    def exited(self) -> dict[str, int]:
        return {name: code for name, code in self.codes.items() if code is not None}

    def restart(self, name: str) -> None:
        self.restarted.append(name)
        if name in self.fail_next:
            self.fail_next.discard(name)
            self.codes[name] = 1
            raise RuntimeError(f"{name} exited with code 1")
        self.codes[name] = None


POLICY = RestartPolicy(max_restarts=3, window_s=60.0, initial_backoff_s=1.0, max_backoff_s=3.0)


def supervised(names=("controlplane", "dataplane", "gateway"), policy=POLICY):
    stack, clock, lines = FakeStack(list(names)), FakeClock(), []
    return stack, clock, lines, Supervisor(stack, policy, clock=clock, log=lines.append)


def test_only_the_exited_process_restarts_after_its_backoff():
    stack, clock, lines, supervisor = supervised()
    assert supervisor.check() is None and stack.restarted == []
    stack.codes["controlplane"] = -9
    assert supervisor.check() is None
    assert stack.restarted == [], "restarted before its backoff"
    clock.now += 0.99
    supervisor.check()
    assert stack.restarted == []
    clock.now += 0.02
    supervisor.check()
    assert stack.restarted == ["controlplane"]
    assert stack.exited() == {}
    assert supervisor.restarts("controlplane") == 1 and supervisor.restarts("dataplane") == 0
    assert any("controlplane exited with code -9" in line for line in lines)


def test_backoff_doubles_up_to_its_cap():
    stack, clock, _, supervisor = supervised()
    waits = []
    for _ in range(3):
        stack.codes["dataplane"] = 1
        supervisor.check()
        start, before = clock.now, len(stack.restarted)
        while len(stack.restarted) == before:
            clock.now += 0.25
            supervisor.check()
        waits.append(clock.now - start)
    assert waits == [1.0, 2.0, 3.0]


def crash_and_restart(stack, clock, supervisor, name: str, times: int) -> None:
    """``name`` exits and is restarted ``times`` times."""
    for _ in range(times):
        stack.codes[name] = 1
        assert supervisor.check() is None
        clock.now += POLICY.max_backoff_s
        assert supervisor.check() is None
        assert name not in stack.exited()


def test_gives_up_on_a_process_past_max_restarts_in_the_window():
    stack, clock, lines, supervisor = supervised()
    crash_and_restart(stack, clock, supervisor, "gateway", POLICY.max_restarts)
    stack.codes["gateway"] = 1
    assert supervisor.check() == "gateway"
    assert stack.restarted == ["gateway"] * POLICY.max_restarts
    assert "giving up" in lines[-1]


def test_restarts_older_than_the_window_do_not_count():
    stack, clock, _, supervisor = supervised()
    crash_and_restart(stack, clock, supervisor, "gateway", POLICY.max_restarts)
    clock.now += POLICY.window_s
    assert supervisor.restarts("gateway") == 0
    stack.codes["gateway"] = 1
    assert supervisor.check() is None
    clock.now += POLICY.initial_backoff_s
    supervisor.check()
    assert len(stack.restarted) == POLICY.max_restarts + 1


def test_a_failed_restart_is_retried_and_counts():
    stack, clock, lines, supervisor = supervised()
    stack.fail_next.add("dataplane")
    stack.codes["dataplane"] = 1
    supervisor.check()
    clock.now += 1.0
    supervisor.check()
    assert stack.restarted == ["dataplane"] and stack.exited() == {"dataplane": 1}
    assert any("restarting dataplane failed" in line for line in lines)
    supervisor.check()  # notices the exit again: the second restart waits 2 s
    clock.now += 1.99
    supervisor.check()
    assert stack.restarted == ["dataplane"]
    clock.now += 0.01
    supervisor.check()
    assert stack.restarted == ["dataplane", "dataplane"] and stack.exited() == {}
    assert supervisor.restarts("dataplane") == 2


def test_two_processes_exit_at_once_and_both_restart():
    stack, clock, _, supervisor = supervised()
    stack.codes["gateway"] = 1
    stack.codes["controlplane"] = 1
    supervisor.check()
    clock.now += 1.0
    supervisor.check()
    assert sorted(stack.restarted) == ["controlplane", "gateway"]


def test_zero_restarts_stops_at_the_first_exit():
    stack, _, _, supervisor = supervised(policy=RestartPolicy(max_restarts=0))
    stack.codes["dataplane"] = 1
    assert supervisor.check() == "dataplane"
    assert stack.restarted == []


@pytest.mark.parametrize(
    "kwargs",
    [{"max_restarts": -1}, {"window_s": 0.0}, {"initial_backoff_s": -1.0}, {"initial_backoff_s": 5.0, "max_backoff_s": 1.0}],
)
def test_policy_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)


def test_cli_flags_reach_the_policy_and_the_state_dir(tmp_path, capsys):
    launch = parse_args(["--model", str(DEFAULT_MODEL), "--state-dir", str(tmp_path / "state"),
                         "--max-restarts", "2", "--restart-window-s", "30"])
    assert launch.restart == RestartPolicy(max_restarts=2, window_s=30.0)
    assert launch.stack.db_path == tmp_path / "state" / "controlplane.sqlite3"
    assert launch.stack.log_dir == tmp_path / "state" / "logs"
    with pytest.raises(SystemExit):
        parse_args(["--model", str(DEFAULT_MODEL), "--state-dir", str(tmp_path), "--max-restarts", "-1"])
    assert "max_restarts must be >= 0" in capsys.readouterr().err


def test_the_dataplane_start_timeout_comes_from_the_config(tmp_path, capsys):
    launch = parse_args(["--model", str(DEFAULT_MODEL), "--state-dir", str(tmp_path),
                         "--dataplane-start-timeout-s", "0.3"])
    assert launch.stack.dataplane_start_timeout_s == 0.3
    assert parse_args(["--model", str(DEFAULT_MODEL), "--state-dir", str(tmp_path)]).stack \
        .dataplane_start_timeout_s == StackConfig.dataplane_start_timeout_s
    with pytest.raises(SystemExit):
        parse_args(["--model", str(DEFAULT_MODEL), "--state-dir", str(tmp_path), "--dataplane-start-timeout-s", "0"])
    # A real dataplane cannot load in 0.3 s: the wait gives up at the config's limit.
    stack = Stack(launch.stack)
    try:
        with pytest.raises(TimeoutError, match="not healthy after 0.3 s"):
            stack.start_dataplane()
    finally:
        stack.stop()
