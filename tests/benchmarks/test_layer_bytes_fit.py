"""benchmarks/layer_bytes_fit.py: the line through a layer table's uniform
rows, and each row's excess over the copy."""

import json

import pytest

from benchmarks.layer_bytes_fit import fit_layers, fit_line, main

COPY_GBPS = 3000.0


def _row(model, batch, bits, megabytes, fixed_us, gbps):
    # A bench_moe row whose time is fixed_us plus its bytes at gbps.
    return dict(model=model, batch=batch, bits=bits, weight_bytes=int(megabytes * 1e6),
                time_us=fixed_us + megabytes * 1e6 / (gbps * 1e9) * 1e6)


def _table():
    rows = [dict(model="m", tune=None)]
    rows += [_row("m", 16, bits, mb, 40.0, 2500.0) for bits, mb in (("8", 700.0), ("4", 370.0), ("2", 205.0))]
    rows.append(_row("m", 16, "mixed", 370.0, 90.0, 2500.0))  # not a uniform row: left out of the line
    rows.append(_row("m", 1, "4", 90.0, 20.0, 2500.0))  # one bitwidth: no line
    rows += [_row("q", 64, bits, mb, 75.0, 3300.0) for bits, mb in (("6", 400.0), ("3", 210.0))]
    return dict(layer=dict(copy_GBps=COPY_GBPS, moe=rows))


def test_the_line_recovers_the_fixed_time_and_the_bandwidth():
    fits = {(f.model, f.batch): f for f in fit_layers(_table())}
    assert set(fits) == {("m", 16), ("q", 64)}
    m = fits["m", 16]
    assert m.points == 3
    assert m.fixed_us == pytest.approx(40.0)
    assert m.marginal_GBps == pytest.approx(2500.0)
    assert m.marginal_vs_copy == pytest.approx(2500.0 / COPY_GBPS)
    assert m.max_residual_us == pytest.approx(0.0, abs=1e-9)
    q = fits["q", 64]
    assert (q.fixed_us, q.marginal_GBps) == (pytest.approx(75.0), pytest.approx(3300.0))


def test_the_excess_is_each_rows_time_less_its_bytes_at_the_copy():
    m = {(f.model, f.batch): f for f in fit_layers(_table())}["m", 16]
    assert set(m.excess_us) == {"8", "4", "2"}
    for bits, mb in (("8", 700.0), ("4", 370.0), ("2", 205.0)):
        expected = 40.0 + mb / 2500.0 * 1e3 - mb / COPY_GBPS * 1e3
        assert m.excess_us[bits] == pytest.approx(expected)


def test_the_bytes_are_the_weights_and_the_activations_as_the_table_counts_them():
    # bench_moe's pct_hbm counts weight_bytes + act_bytes; so does the excess.
    table = _table()
    for row in table["layer"]["moe"]:
        if row.get("batch") == 16:
            row["act_bytes"] = 2_000_000
    m = {(f.model, f.batch): f for f in fit_layers(table)}["m", 16]
    expected = 40.0 + 700.0 / 2500.0 * 1e3 - 702.0 / COPY_GBPS * 1e3
    assert m.excess_us["8"] == pytest.approx(expected)


def test_a_table_without_a_copy_has_no_excess_or_ratio():
    table = _table()
    del table["layer"]["copy_GBps"]
    f = fit_layers(table)[0]
    assert f.excess_us == {} and f.marginal_vs_copy is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no 'moe' rows"):
        fit_layers(dict(runs=[]))
    with pytest.raises(ValueError, match="two distinct"):
        fit_line([1.0, 1.0], [2.0, 3.0])


def test_main_prints_one_line_per_fit(tmp_path, capsys, monkeypatch):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(_table()["layer"]))
    monkeypatch.setattr("sys.argv", ["layer_bytes_fit.py", str(path)])
    main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| m | 16 | 3 | 40.0 | 2500 | 0.83 |")
