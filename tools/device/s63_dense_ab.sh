#!/usr/bin/env bash
# Session 63: the dense decode product's K chunks past a 16-token tile (kernels/dense_mma.default_tiles:
# 128 x 5 stages, new) against one shape for every batch (256 x as many of 5 stages as fit, as before:
# --dense-mma-tiles '{"block_k":256}'), end to end, synthetic Mixtral-8x7B 4-bit at B=32/64, rounds
# new old new old; then the kernel's GPU tests.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s63_dense_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
for r in a b; do
  e2e_run 150 "k128_r$r" --bits 4 --batches 32,64
  e2e_run 150 "k256_r$r" --bits 4 --batches 32,64 --dense-mma-tiles '{"block_k":256}'
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_dense_ab_s63.json" > /tmp/table.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_dense_mma.py 2>&1 | tail -1
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tail -6 /tmp/table.txt
