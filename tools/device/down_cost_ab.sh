#!/usr/bin/env bash
# Session 52: the down launch's cost table with the spread over the 2-bit view halved, (16, 18, 19,
# 21, 23) against the shipped (8, 10, 11, 13, 15) (tools/device/down_cost_b32_probe.sh found 6-bit
# costs of 10-11 against 8 for 2 bits 1-2 % faster at B=16/32 on whole-expert 6/2). (1) The layer,
# Mixtral, random routing, round robin shipped / halved / (8, 10, 10, 10, 12) / shipped, on
# whole-expert mixes 6/2, 8/4, 8/2, 4/3; (2) end to end, mixed 2/6 at B=16/32 (uniform 4-bit
# beside the shipped runs: a uniform state's shares do not depend on the table), two interleaved
# rounds. ~6 minutes. Usage, with carry [".carry", "pagedweight", ".whl"] after `make install
# proto` and tools/device/stage.sh:  bash tools/device/down_cost_ab.sh <commit> [TABLE]
source .carry/on_device.sh || exit 1
C=$1
TABLE=${2:-16,18,19,21,23}
BASE='"block_n":128,"num_warps":4,"use_asm":true'
cand() { echo "{$BASE,\"tuning\":{\"down_group_cost\":[$1]}}"; }
timeout 120 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 110 --commit "$C" \
  --routing random --candidates "[$(cand 8,10,11,13,15),$(cand $TABLE),$(cand 8,10,10,10,12),$(cand 8,10,11,13,15)]" \
  --tune-cases 32:views-6.6.6-2.2.2,16:views-6.6.6-2.2.2,32:views-8.8.8-4.4.4,16:views-8.8.8-2.2.2,32:views-4.4.4-3.3.3 \
  --out "${OUT:-/tmp}/moe_down_cost_ab.json" 2>&1 | grep "^tune" | tail -4
rm -rf /tmp/runs
for r in a b; do
  e2e_run 100 "shipped_r$r" --bits 4,mixed26 --batches 16,32
  e2e_run 80 "table_r$r" --bits mixed26 --batches 16,32 --down-group-cost "$TABLE"
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_down_cost_ab.json" | tail -7
