#!/usr/bin/env bash
# Session 52: the flatter down cost table (16, 18, 19, 21, 23), now shipped, against the old (8, 10,
# 11, 13, 15) end to end at B=1 and 4, where the launches also balance the down launch (the
# one-token and 8-token tiles); tools/device/down_cost_ab.sh measured B=16/32. Mixed 2/6, uniform
# 4-bit beside the shipped runs, two interleaved rounds. Its call in session 52 came on a fresh H200
# and the first round's runs ran out of time compiling (100 / 80 s): the first run now has 300 s.
# ~6 minutes on a fresh machine. Usage, with carry [".carry", "pagedweight", ".whl"] after `make
# install proto` and tools/device/stage.sh:  bash tools/device/down_cost_small_ab.sh <commit> [BATCHES]
source .carry/on_device.sh || exit 1
C=$1
BATCHES=${2:-1,4}
rm -rf /tmp/runs
for r in a b; do
  e2e_run $([ $r = a ] && echo 300 || echo 120) "shipped_r$r" --bits 4,mixed26 --batches "$BATCHES"
  e2e_run 100 "old_table_r$r" --bits mixed26 --batches "$BATCHES" --down-group-cost 8,10,11,13,15
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_down_cost_small_ab.json" | tail -12
