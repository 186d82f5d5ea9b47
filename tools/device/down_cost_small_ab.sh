#!/usr/bin/env bash
# Session 52: the flatter down cost table (16, 18, 19, 21, 23), now shipped, against the old (8, 10,
# 11, 13, 15) end to end at B=1 and 4, where the launches also balance the down launch (the
# one-token and 8-token tiles); tools/device/down_cost_ab.sh measured B=16/32. Mixed 2/6, uniform
# 4-bit beside the shipped runs, two interleaved rounds. ~5 minutes. Usage, with carry [".carry",
# "pagedweight", ".whl"] after `make install proto` and tools/device/stage.sh:
#   bash tools/device/down_cost_small_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
for r in a b; do
  e2e_run 100 "shipped_r$r" --bits 4,mixed26 --batches 1,4
  e2e_run 80 "old_table_r$r" --bits mixed26 --batches 1,4 --down-group-cost 8,10,11,13,15
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_down_cost_small_ab.json" | tail -7
