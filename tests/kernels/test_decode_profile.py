"""benchmarks/decode_profile.py: the critical-path shares of a trace, on
hand-made profiler events (the GPU trace itself is read on the device)."""

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from benchmarks.decode_profile import IDLE, critical_path


def kernel(name: str, start: float, end: float, device: DeviceType = DeviceType.CUDA) -> FunctionEvent:
    return FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end, device_type=device)


def test_overlapping_launches_count_only_what_they_add_and_gaps_are_idle():
    # b starts under a (a PDL launch waiting), c after a gap, b again under c.
    events = [kernel("a", 0, 10), kernel("b", 8, 15), kernel("c", 20, 25), kernel("b", 22, 30)]
    shares = critical_path(events)
    assert shares == {"a": 10.0, "b": 10.0, "c": 5.0, IDLE: 5.0}
    assert sum(v for n, v in shares.items() if n != IDLE) == pytest.approx(30 - 0 - 5)


def test_a_kernel_inside_another_adds_nothing_and_host_events_are_ignored():
    events = [kernel("outer", 0, 20), kernel("inner", 5, 12), kernel("host", 0, 50, DeviceType.CPU),
              kernel("next", 18, 26)]
    assert critical_path(events) == {"outer": 20.0, "inner": 0.0, "next": 6.0, IDLE: 0.0}
