#!/usr/bin/env bash
# Session 55's second call (on the machine warm from tools/device/s55_call.sh, <= 560 s): the layer,
# Mixtral, random routing, B=64 (and 48) at 4 / 2 / 8 bits, round robin of shipped / gate/up as two
# launches with the base tile at 4 stages / at 3 / shipped; then the issue-5 layer table (both models,
# every bitwidth, B = 1 / 4 / 16 / 64, round robin routing).
# Usage, as s55_call.sh:  bash tools/device/s55_layer.sh <commit>
source .carry/on_device.sh || exit 1
BASE='"block_n":128,"num_warps":4,"use_asm":true'
CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":4}},"
CANDS+="{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":3}},{$BASE}]"
timeout 150 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 140 --commit "$1" \
  --routing random --tune-cases 64:4,64:2,64:8,48:4 --candidates "$CANDS" \
  --out "${OUT:-/tmp}/moe_split_gate_up_random.json" 2>&1 | grep "^tune" | tail -6
timeout 370 python3 benchmarks/bench_moe.py --models mixtral,qwen --bits 8,6,4,3,2,mixed \
  --batches 1,4,16,64 --stage-bits 4,mixed --kernels-only --no-check --budget 355 --commit "$1" \
  --out "${OUT:-/tmp}/moe_table.json" 2>&1 | grep -v "^ *$" | tail -60
