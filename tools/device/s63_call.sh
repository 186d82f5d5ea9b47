#!/usr/bin/env bash
# Session 63's first call: (1) the GPU tests of the apart gate/up launch, the paired form included (never
# run on a GPU before); (2) the dense decode product at 32 and 64 tokens over narrower row tiles and
# shorter K chunks (benchmarks/bench_dense_mma.py; the B=64 profile put it at 69 % of the copy, 64-row
# tiles giving the o projection 64 programs for 132 multiprocessors); (3) the paired gate/up launch
# against the shipped apart launch, layer and end to end (tools/device/tuning_ab.sh).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (560)] bash tools/device/s63_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-560}
O=${OUT:-/tmp}
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_combine.py \
  -k "gpu_apart" 2>&1 | tail -1 > /tmp/tests.txt
timeout 120 python3 benchmarks/bench_dense_mma.py --commit "$C" --tokens 32,64 --default-tokens 16 \
  --block-n 32,64 --block-k 64,128,256 --stages 3,4,5,6 --out "$O/dense_mma_t64_s63.json" 2>&1 | tail -6 \
  > /tmp/dense.txt
LIMIT=$((LIMIT - SECONDS)) CASES=16:4,64:4,64:2,64:8,48:4 E2E_ARGS="--bits 4,mixed26 --batches 16,64" \
  bash tools/device/tuning_ab.sh "$C" '{"base_tile_gate_up_paired":true}' --base-tile-gate-up-paired \
  > /tmp/ab_out.txt 2>&1
tail -16 /tmp/ab_out.txt
cat /tmp/tests.txt /tmp/dense.txt
