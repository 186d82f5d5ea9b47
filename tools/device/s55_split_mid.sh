#!/usr/bin/env bash
# Session 55's third call (fresh machine, <= 560 s). The gate/up split into two launches, run one
# after the other, lost 1.8 % end to end at B=64 on the H100 (the layer 3.7 % slower) but its layer
# ran 6.5 % faster at B=48 (random routing; fewer experts over 16 tokens). Now the two launches run
# at once on two streams (two graph branches), so that each fills the other's tail. On an H200
# first the issue-5 end-to-end cells at the shipped defaults, then one pair at B = 48 / 64; on an
# H100 the layer at B = 48 / 56 / 64 and two end-to-end rounds at B = 48 / 56 / 64.
# Usage, as s55_call.sh:  bash tools/device/s55_split_mid.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
SPLIT="--wide-gate-up-split-stages 4"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  e2e_run 250 table --bits 8,4,mixed26 --batches 1,16,64
  e2e_run 120 shipped_ra --bits 4,mixed26 --batches 48,64
  e2e_run 120 split4_ra --bits 4,mixed26 --batches 48,64 $SPLIT
else
  BASE='"block_n":128,"num_warps":4,"use_asm":true'
  CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":4}},{$BASE}]"
  timeout 80 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 70 --commit "$C" \
    --routing random --tune-cases 48:4,56:4,64:4,64:2,64:8 --candidates "$CANDS" \
    --out "${OUT:-/tmp}/moe_split_gate_up_mid.json" 2>&1 | grep "^tune" | tail -4
  e2e_run 170 shipped_ra --bits 4,mixed26 --batches 48,56,64
  e2e_run 100 split4_ra --bits 4,mixed26 --batches 48,56,64 $SPLIT
  e2e_run 90 shipped_rb --bits 4,mixed26 --batches 48,56,64
  e2e_run 90 split4_rb --bits 4,mixed26 --batches 48,56,64 $SPLIT
fi
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_split_mid.json" | tail -16
