#!/usr/bin/env bash
# Session 57's end-to-end A/B of gate/up pairs (MoeTuning.gate_up_pair_stages STAGES) against the
# shipped launch: synthetic Mixtral-8x7B, 4-bit and whole-expert mixed 2/6 at B = 4 / 8 / 64 (where the
# layer ran faster or level with pairs, moe_pairs_h100_s57.json), two interleaved rounds (the first
# run compiles both).
# Ran at 6884b90 (the pair path was removed after it measured slower: benchmarks/NOTES.md session 57).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s57_e2e.sh <commit> <stages>
source .carry/on_device.sh || exit 1
C=$1
P=${2:-3}
rm -rf /tmp/runs
ARGS="--bits 4,mixed26 --batches 4,8,64"
e2e_run 170 pair${P}_ra $ARGS --gate-up-pair-stages "$P"
e2e_run 110 base_ra $ARGS
e2e_run 80 pair${P}_rb $ARGS --gate-up-pair-stages "$P"
e2e_run 80 base_rb $ARGS
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_pairs_s57.json" | tail -24
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
