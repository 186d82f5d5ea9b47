"""bench_moe.py's mixed-state summaries (issue 5's "cost of mixed bitwidths"),
on made-up rows: which rows are compared, against what."""

import pytest

from benchmarks.bench_moe import mixed_summaries


def row(bits: str, us: float, batch: int = 16, weight_bytes: int = 100) -> dict:
    return dict(model="mixtral-8x7b", batch=batch, bits=bits, time_us=us, weight_bytes=weight_bytes)


def test_both_kinds_of_mix_are_compared_with_uniform_4_and_their_views():
    timed = [row("2", 200.0, weight_bytes=50), row("4", 300.0), row("6", 420.0, weight_bytes=150),
             row("mixed", 306.0), row("views-6.6.6-2.2.2", 315.0), row("views-2.6.4-6.2.4", 301.0),
             row("mixed", 999.0, batch=4)]  # no uniform row at B=4: compared with nothing
    vs_uniform, vs_views = mixed_summaries(timed)
    assert [(m["bits"], m["batch"]) for m in vs_uniform] == [("mixed", 16), ("views-6.6.6-2.2.2", 16)]
    assert vs_uniform[0]["slowdown_pct"] == pytest.approx(2.0)
    assert vs_uniform[1]["slowdown_pct"] == pytest.approx(5.0)
    assert all(m["same_bytes"] for m in vs_uniform)
    assert [m["bits"] for m in vs_views] == ["mixed", "views-6.6.6-2.2.2"]
    assert vs_views[0]["views_mean_us"] == pytest.approx(310.0)
    assert vs_views[1]["excess_pct"] == pytest.approx(100 * (315.0 / 310.0 - 1))


def test_a_mix_of_other_views_is_not_compared_with_uniform_4():
    timed = [row("3", 250.0), row("8", 480.0), row("4", 300.0), row("mixed3-8", 370.0)]
    vs_uniform, vs_views = mixed_summaries(timed)
    assert vs_uniform == []  # 3-8 has other bytes than uniform 4
    assert [m["bits"] for m in vs_views] == ["mixed3-8"]
    assert vs_views[0]["views_mean_us"] == pytest.approx(365.0)
