#!/usr/bin/env bash
# Session 55: B=64's gate/up as two launches, one per token class (MoeTuning.wide_gate_up_split_stages,
# MoeTiles.gate_up_split_stages), against the shipped one launch with both tiles compiled in (which
# costs the 16-token loops 5-8 % when no program takes the wide tile: session 53). First the layer,
# Mixtral, random routing, B=64 (and 48) at 4 / 2 / 8 bits, round robin of shipped / split with the
# base tile at 4 stages / at 3 / shipped; then end to end, synthetic Mixtral-8x7B, B=64 4-bit and
# mixed 2/6, shipped against split 4 (one round each on a fresh machine: its first run compiles).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/split_gate_up_ab.sh <commit> [e2e seconds of the first run]
source .carry/on_device.sh || exit 1
C=$1
FIRST=${2:-170}
BASE='"block_n":128,"num_warps":4,"use_asm":true'
CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":4}},"
CANDS+="{$BASE,\"tuning\":{\"wide_gate_up_split_stages\":3}},{$BASE}]"
timeout 150 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 140 --commit "$C" \
  --routing random --tune-cases 64:4,64:2,64:8,48:4 --candidates "$CANDS" \
  --out "${OUT:-/tmp}/moe_split_gate_up_random.json" 2>&1 | grep "^tune" | tail -6
rm -rf /tmp/runs
e2e_run "$FIRST" shipped --bits 4,mixed26 --batches 64
e2e_run 110 split4 --bits 4,mixed26 --batches 64 --wide-gate-up-split-stages 4
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_split_gate_up_ab.json" | tail -6
