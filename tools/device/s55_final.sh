#!/usr/bin/env bash
# Session 55's last call (fresh machine, ~360 s): the GPU test of the gate/up split on two streams
# (eager and CUDA-graph replay against the reference), then the issue-5 end-to-end cells at the new
# defaults (synthetic Mixtral-8x7B, 8 / 4-bit and whole-expert mixed 2/6, B = 1 / 16 / 64).
# Usage, as s55_call.sh:  bash tools/device/s55_final.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
  -k "loaded_experts_with_and_without_wide_tile" 2>&1 | tail -3
rm -rf /tmp/runs
e2e_run 250 table --bits 8,4,mixed26 --batches 1,16,64
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_s55_final.json" | tail -10
