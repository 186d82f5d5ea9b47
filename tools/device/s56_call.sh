#!/usr/bin/env bash
# Session 56's call (fresh machine; limit 590 s). First Nsight Compute counters of the activation
# tile's L2 traffic (tools/device/l2_activation_probe.sh). Then, on an H200, the issue-5 end-to-end
# cells at the defaults (synthetic Mixtral-8x7B, 8 / 4-bit and whole-expert mixed 2/6, B = 1 / 16 /
# 64; follow with tools/device/layer_table.sh); on any other card, the pipeline depths of the gate/up
# split's two launches at B = 40-64 (the layer, random routing), then the GPU test of both
# token-class splits in the time left (session 56's first call lost it to a 90 s timeout).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s56_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $GPU == *H200* ]]; then
  rm -rf /tmp/runs
  bash tools/device/l2_activation_probe.sh "$C"
  e2e_run $((560 - SECONDS)) table --bits 8,4,mixed26 --batches 1,16,64
  python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_s56_h200.json" | tail -10
else
  bash tools/device/l2_activation_probe.sh "$C"
  BASE='"block_n":128,"num_warps":4,"use_asm":true'
  CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":5}},"
  CANDS+="{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":3}},{$BASE,\"tuning\":{\"wide_tile_stages\":4}},{$BASE}]"
  timeout 150 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 140 --commit "$C" \
    --routing random --tune-cases 40:4,48:4,56:4,64:4,64:2,64:8,64:mixed --candidates "$CANDS" \
    --out "${OUT:-/tmp}/moe_split_stages_random.json" 2>&1 | grep "^tune" | tail -5
  timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
    -k "loaded_experts_with_and_without_wide_tile" 2>&1 | tail -3
fi
echo "GPU: $GPU"
