"""benchmarks/down_balance_model.py: the plan's order and shares as the down
launch computes them, and the imbalance a mis-scaled cost table predicts."""

import json

import pytest

from benchmarks.down_balance_model import derived_costs, imbalance, main, plan_order, program_groups, times_from_bench


def test_plan_order_alternates_from_both_ends():
    assert plan_order(6, zigzag=False) == [0, 1, 2, 3, 4, 5]
    assert plan_order(6, zigzag=True) == [0, 5, 1, 4, 2, 3]
    assert plan_order(5, zigzag=True) == [0, 4, 1, 3, 2]


@pytest.mark.parametrize("units,groups,programs", [([13, 13, 8, 8], 112, 8), ([3, 7, 5], 11, 4), ([1], 5, 8)])
def test_shares_cover_every_group_once(units, groups, programs):
    shares = program_groups(units, groups, programs)
    assert len(shares) == programs
    for pos in range(len(units)):
        assert sum(g for share in shares for p, g in share if p == pos) == groups


def test_equal_views_split_evenly_without_straddles():
    r = imbalance([4] * 8, (8, 10, 11, 13, 15), {4: 100.0}, 112, 8, zigzag=False)
    assert r == dict(longest_over_ideal=1.0, straddling=0)


def test_a_table_flatter_than_the_card_overloads_the_costly_programs():
    # 6-bit groups twice the 2-bit ones' time, the table says 13 : 8
    times = {2: 68.0, 6: 136.0}
    flat = imbalance([2, 6] * 4, (8, 10, 11, 13, 15), times, 112, 8, zigzag=False)
    fitted = imbalance([2, 6] * 4, derived_costs(times, (8, 10, 11, 13, 15)), times, 112, 8, zigzag=False)
    assert flat["longest_over_ideal"] > 1.05
    assert fitted["longest_over_ideal"] < 1.01
    assert flat["straddling"] == 7
    assert imbalance([2, 6] * 4, (8, 10, 11, 13, 15), times, 112, 8, zigzag=True)["straddling"] == 4


def test_derived_costs_keep_the_cheapest_view_and_unmeasured_ones():
    assert derived_costs({2: 60.0, 4: 90.0, 6: 120.0}, (8, 10, 11, 13, 15)) == (8, 10, 12, 16, 15)


def test_reads_uniform_down_rows_from_a_bench_json(tmp_path, capsys):
    rows = [dict(batch=16, bits=b, stage_us=dict(prepare=4.0, gate_up=1.0, down=t))
            for b, t in (("2", 68.0), ("6", 136.0), ("mixed", 109.0))]
    rows += [dict(batch=4, bits="2", stage_us=dict(prepare=4.0, gate_up=1.0, down=50.0)), dict(model="m")]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(dict(moe=rows)))
    assert times_from_bench(path, 16) == {2: 68.0, 6: 136.0}
    main(["--from-json", str(path)])
    assert "derived" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--from-json", str(path), "--views", "2,8"])


def test_times_on_the_command_line(capsys):
    main(["--times", "2=233,6=383"])
    out = capsys.readouterr().out
    assert "shipped" in out and "4 of 8" in out
    for bad in ("2=233,6", "2=fast", "4=1,6=2"):  # malformed, or no time for the low view
        with pytest.raises(SystemExit):
            main(["--times", bad])
