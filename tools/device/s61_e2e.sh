#!/usr/bin/env bash
# Session 61's end-to-end A/B of MoeTiles.gate_up_apart (kernels/moe_combine.py; MoeTuning.
# gate_up_apart_max_tokens) against the gate/up launch with its combine: synthetic Mixtral-8x7B,
# 4-bit and whole-expert mixed 2/6 at B = 1 / 16 / 64, rounds a (the first run compiles both) and b
# where LIMIT leaves time; then its GPU tests.
# Ran at 6e5428a (then --gate-up-apart turned it on) on an H100, ARGS "--bits 4,mixed26 --batches
# 16,64" and "--bits 4 --batches 4,32": benchmarks/results/s61_e2e_apart_h100.json.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] [ARGS=e2e_decode.py flags] bash tools/device/s61_e2e.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
rm -rf /tmp/runs
ARGS=${ARGS:-"--bits 4,mixed26 --batches 1,16,64"}
e2e_run 170 apart_ra $ARGS
e2e_run 130 base_ra $ARGS --gate-up-apart-max-tokens 0
[[ $(left) -gt 180 ]] && e2e_run 80 apart_rb $ARGS && e2e_run 80 base_rb $ARGS --gate-up-apart-max-tokens 0
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_apart_s61.json" > /tmp/table.txt
[[ $(left) -gt 60 ]] && timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/kernels/test_moe_combine.py 2>&1 | tail -2
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tail -16 /tmp/table.txt
