#!/usr/bin/env bash
# Session 52: at B=32 (16-token tile, balanced down launch) the whole-expert mix 6/2's down launch ran
# 110.2 us against its views' mean 106.75 (+3.2 %; moe_table_h100_s52.json's zigzag rows), which
# the cost table's 6 : 2 ratio (13 : 8) against the uniform launches' (135.8 : 77.7) would explain
# (benchmarks/down_balance_model.py). Here the layer, Mixtral, random routing, round robin of
# down_group_cost tables (views 2 / 3 / 4 / 6 / 8 bits): shipped, 6 and 8 bits dearer, cheaper,
# much dearer, 4 bits dearer, shipped; on whole-expert mixes 6/2 and 4/2 at B=32 and 6/2 at B=16.
# ~2 minutes. Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/down_cost_b32_probe.sh <commit> [cheaper]
source .carry/on_device.sh || exit 1
BASE='"block_n":128,"num_warps":4,"use_asm":true'
cand() { echo "{$BASE,\"tuning\":{\"down_group_cost\":[$1]}}"; }
if [ "$2" = cheaper ]; then  # the second call: 6 and 8 bits cheaper still, down to equal costs
  CANDS="[$(cand 8,10,11,13,15),$(cand 8,10,11,12,14),$(cand 8,10,11,11,13),$(cand 8,10,10,10,12)"
  CANDS+=",$(cand 8,9,10,11,12),$(cand 8,10,11,12,14),$(cand 8,10,11,13,15)]"
  CASES=32:views-6.6.6-2.2.2,16:views-6.6.6-2.2.2,32:mixed,4:views-6.6.6-2.2.2
else
  CANDS="[$(cand 8,10,11,13,15),$(cand 8,10,11,14,16),$(cand 8,10,11,12,14),$(cand 8,10,11,15,18)"
  CANDS+=",$(cand 8,10,12,13,15),$(cand 8,10,11,13,15)]"
  CASES=32:views-6.6.6-2.2.2,32:views-4.4.4-2.2.2,16:views-6.6.6-2.2.2,32:mixed
fi
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 185 --commit "$1" \
  --routing random --tune-cases $CASES \
  --candidates "$CANDS" --out "${OUT:-/tmp}/moe_down_cost_b32.json" 2>&1 | grep "^tune" | tail -7
