#!/usr/bin/env bash
# Session 57's first call: gate and up of one view in one gate/up program (MoeTuning.gate_up_pair_stages)
# against the shipped launch, the layer with random routing (Mixtral-8x7B; B=16 on the 8-token tile,
# B=64 on the gate/up split), then the pair tests on the GPU in the time left.
# Ran at 318e8d3 (the pair path was removed after it measured slower: benchmarks/NOTES.md session 57).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s57_pairs.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
BASE='"use_asm":true'
P3='"gate_up_pair_stages":3'
CANDS="[{$BASE},{$BASE,\"tuning\":{$P3}},{$BASE,\"tuning\":{$P3,\"gate_up_pair_split\":2}},"
CANDS+="{$BASE,\"tuning\":{\"gate_up_pair_stages\":2}},{$BASE}]"
timeout 400 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 390 --commit "$C" \
  --routing random --tune-cases 4:4,16:4,16:2,16:8,16:views-6.6.6-2.2.2,64:4,64:2 --candidates "$CANDS" \
  --out "${OUT:-/tmp}/moe_pairs_s57.json" 2>&1 | grep "^tune" | tail -10
timeout $((575 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe_gate_up_pairs.py \
  -k "beside or wide_tile" 2>&1 | tail -3
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
