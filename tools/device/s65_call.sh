#!/usr/bin/env bash
# Session 65's device call. On an H200 (none since session 56): issue 5's end-to-end table with the
# transformers peer in the same call (about 9 minutes on a fresh machine; the peer's bf16 weights,
# 93 GB, fit only the H200, so call with needs_h200). On any other card: the GPU-marked tests under
# $GPU_TESTS (default tests/kernels; of the 52 GPU-marked tests a fresh H100 ran 20 in 520 s, most of
# it compiling, and the same machine warm 29 in 330 s: give each folder, or file, its own call), which
# tests/conftest.py's pytest_pyfunc_call wrapper now runs too. Usage, with carry
# [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [GPU_TESTS="..."] bash tools/device/s65_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # shellcheck disable=SC2086  # GPU_TESTS is a list of paths
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts="" -rfE ${GPU_TESTS:-tests/kernels} \
    2>&1 | tail -25
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  exit 0
fi
# The peer first (bf16 Mixtral-8x7B, 93 GB: the H200 only), then the engine's table.
timeout 100 python3 benchmarks/e2e_peer_hf.py --batches 1,16 --steps 16 --commit "$C" \
  --out "${OUT:-/tmp}/e2e_peer.json" 2>&1 | tail -4
bash tools/device/h200_table.sh "$C"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
