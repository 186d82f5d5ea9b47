#!/usr/bin/env bash
# Session 55's third call (fresh machine, <= 560 s). The gate/up split (--wide-gate-up-split-stages
# 4) lost 1.8 % end to end at B=64 on the H100 but its layer ran 6.5 % faster at B=48 (random
# routing): fewer experts over 16 tokens. So B = 40 / 48 / 56, where the wide tile is compiled in
# (mean over 8 tokens an expert). On an H200 first the issue-5 end-to-end cells at the shipped
# defaults, then one pair at B=48; on an H100 the layer at B = 40 / 48 / 56 and two end-to-end rounds.
# Usage, as s55_call.sh:  bash tools/device/s55_split_mid.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
SPLIT="--wide-gate-up-split-stages 4"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  e2e_run 250 table --bits 8,4,mixed26 --batches 1,16,64
  e2e_run 120 shipped_ra --bits 4,mixed26 --batches 48
  e2e_run 120 split4_ra --bits 4,mixed26 --batches 48 $SPLIT
else
  BASE='"block_n":128,"num_warps":4,"use_asm":true'
  CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":4}},{$BASE}]"
  timeout 80 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 70 --commit "$C" \
    --routing random --tune-cases 40:4,48:4,56:4,48:2,48:8 --candidates "$CANDS" \
    --out "${OUT:-/tmp}/moe_split_gate_up_mid.json" 2>&1 | grep "^tune" | tail -4
  e2e_run 170 shipped_ra --bits 4,mixed26 --batches 40,48,56
  e2e_run 100 split4_ra --bits 4,mixed26 --batches 40,48,56 $SPLIT
  e2e_run 90 shipped_rb --bits 4,mixed26 --batches 40,48,56
  e2e_run 90 split4_rb --bits 4,mixed26 --batches 40,48,56 $SPLIT
fi
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_split_mid.json" | tail -16
