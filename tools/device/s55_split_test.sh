#!/usr/bin/env bash
# The GPU tests of the gate/up split on two streams (eager and CUDA-graph replay against the
# reference) and of the wide tile around it. Usage, as s55_call.sh:  bash tools/device/s55_split_test.sh
source .carry/on_device.sh || exit 1
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
  -k "loaded_experts_with_and_without_wide_tile" 2>&1 | tail -4
