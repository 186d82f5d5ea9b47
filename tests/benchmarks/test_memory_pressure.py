"""The memory-pressure benchmark (benchmarks/memory_pressure.py) on the tiny
synthetic preset, CPU: in one tight arena the dynamic cases walk their experts
down while the burst's KV grows and back to 8 bits after it (the planned ones
on a real controlplane's ladders, one of them above a floor), the static cases
keep their bits, and every case generates every token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dataplane.kv_cache import blocks_for_tokens

REPO = Path(__file__).resolve().parents[2]
REQUESTS, PROMPT_LEN, MAX_TOKENS, KV_SEQS = 8, 40, 24, 2
FLOOR_BITS = 6


def test_dynamic_precision_serves_the_burst_that_static_8_bit_cannot_hold(tmp_path):
    out = tmp_path / "pressure.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "memory_pressure.py"), "--preset", "mixtral-tiny",
         "--device", "cpu", "--requests", str(REQUESTS), "--prompt-len", str(PROMPT_LEN),
         "--max-tokens", str(MAX_TOKENS), "--kv-seqs", str(KV_SEQS), "--recovery-s", "30", "--out", str(out),
         "--cases", "dynamic,planned,planned-inline,planned-floor,static-4,static-8", "--floor-bits", str(FLOOR_BITS)],
        check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
    )
    result = json.loads(out.read_text())
    budget = result["budget"]
    assert budget["arena_pages"] == budget["expert_pages_at_8_bits"] + KV_SEQS * budget["kv_pages_per_sequence"]
    rows = {row["case"]: row for row in result["rows"]}
    assert set(rows) == {"dynamic", "planned", "planned-inline", "planned-floor", "static-4", "static-8"}
    for row in rows.values():
        assert row["tokens"] == REQUESTS * MAX_TOKENS, row["case"]
        assert row["arena_pages"] == budget["arena_pages"]
    # Static 8-bit: the KV room of KV_SEQS sequences bounds what runs at once.
    assert rows["static-8"]["min_expert_bits"] == rows["static-8"]["mean_expert_bits"] == 8
    assert rows["static-8"]["peak_running"] < REQUESTS
    assert rows["static-4"]["mean_expert_bits"] == 4
    for row in rows.values():  # eight states at the quantiles of the tokens generated (the default)
        assert len(row["served_block_bits"]) == 8, row["case"]
        assert all(len(bits) == len(row["deepest_block_bits"]) for bits in row["served_block_bits"])
    assert {b for bits in rows["static-4"]["served_block_bits"] for b in bits} == {4}
    # Dynamic: demoted under the burst, so all requests ran at once, then back at 8 bits.
    for case in ("dynamic", "planned", "planned-inline"):
        row = rows[case]
        assert row["min_expert_bits"] < 8, case
        assert row["demotions"] > 0 and row["bytes_demoted"] > 0, case
        assert min(row["deepest_block_bits"]) < 8, case
        assert row["peak_running"] == REQUESTS, case
        assert row["preemptions"] == 0, case
        assert row["recovery_seconds"] is not None, case
        assert row["mean_expert_bits_after_trickle"] == 8, case
        assert set(row["weight_pages_by_bits_after_trickle"]) == {"8"}, case
    assert rows["planned"]["plans_received"] >= 1  # from the controlplane's own process
    assert rows["planned-inline"]["plans_received"] >= 1
    assert rows["planned"]["controlplane_cpu_s"] >= 0  # read from its own process (ticks of 10 ms: may be 0 here)
    assert rows["planned-inline"]["controlplane_cpu_s"] is None and rows["dynamic"]["controlplane_cpu_s"] is None
    for case in ("static-4", "static-8"):  # no controller: no transitions, no time in it
        assert rows[case]["demotions"] == rows[case]["promotions"] == 0, case
    for row in rows.values():
        assert 0 < row["iteration_s_median"] <= row["iteration_s_p90"] < row["seconds"], row["case"]
    # The floor holds: no block went below it, however many requests waited.
    floored = rows["planned-floor"]
    assert floored["plans_received"] >= 1
    assert min(floored["deepest_block_bits"]) == FLOOR_BITS
    assert floored["min_expert_bits"] >= FLOOR_BITS


def test_the_compile_warm_up_child_serves_the_burst_and_reports_its_time(tmp_path):
    """The child that fills Triton's cache before the timed cases (run on GPUs only by the parent)."""
    common = [sys.executable, str(REPO / "benchmarks" / "memory_pressure.py"), "--preset", "mixtral-tiny",
              "--device", "cpu", "--requests", str(REQUESTS), "--prompt-len", str(PROMPT_LEN),
              "--max-tokens", str(MAX_TOKENS), "--kv-seqs", str(KV_SEQS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    probe = tmp_path / "probe.json"
    subprocess.run([*common, "--case", "probe", "--row-out", str(probe)], check=True, cwd=REPO, env=env,
                   capture_output=True)
    shape = json.loads(probe.read_text())
    pages = shape["weight_pages_8bit"] + KV_SEQS * blocks_for_tokens(PROMPT_LEN + MAX_TOKENS, shape["kv_block_size"])
    warm = tmp_path / "warm.json"
    subprocess.run([*common, "--case", "warm", "--max-arena-pages", str(pages), "--row-out", str(warm)],
                   check=True, cwd=REPO, env=env, capture_output=True)
    assert json.loads(warm.read_text())["seconds"] > 0
