#!/usr/bin/env bash
# Session 56's table call (fresh machine; limit 590 s). On an H200: the issue-5 end-to-end cells at
# the defaults (synthetic Mixtral-8x7B, 8 / 4-bit and whole-expert mixed 2/6, B = 1 / 16 / 64), then
# the layer table (Mixtral-8x7B and Qwen1.5-MoE, B = 1 / 4 / 16 / 64, 8 / 4 / 2 bits and mixed, round
# robin) in the time left. On any other card: the pipeline depths of the gate/up split's two
# launches and the row-tile-major gate/up order at B = 40-64 (the layer, random routing), then the
# GPU test of both token-class splits (session 56's first call lost it to a 90 s timeout).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s56_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $GPU == *H200* ]]; then
  rm -rf /tmp/runs
  e2e_run 270 table --bits 8,4,mixed26 --batches 1,16,64
  python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_s56_h200.json" | tail -10
  LEFT=$((570 - SECONDS))
  [[ $LEFT -gt 90 ]] && timeout "$LEFT" python3 benchmarks/bench_moe.py --models mixtral,qwen --bits 8,4,2,mixed --batches 1,4,16,64 \
    --kernels-only --no-check --budget $((LEFT - 15)) --commit "$C" --out "${OUT:-/tmp}/moe_table_s56_h200.json" \
    2>&1 | grep -v "^ *$" | tail -36
else
  BASE='"use_asm":true'
  CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":5}},"
  CANDS+="{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":3}},{$BASE,\"tuning\":{\"wide_tile_stages\":4}},"
  CANDS+="{$BASE,\"tuning\":{\"gate_up_interleave_max_tokens\":64}},{$BASE}]"
  timeout 190 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 180 --commit "$C" \
    --routing random --tune-cases 40:4,48:4,56:4,64:4,64:2,64:8,64:mixed --candidates "$CANDS" \
    --out "${OUT:-/tmp}/moe_split_stages_random.json" 2>&1 | grep "^tune" | tail -6
  timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
    -k "loaded_experts_with_and_without_wide_tile" 2>&1 | tail -3
fi
echo "GPU: $GPU"
