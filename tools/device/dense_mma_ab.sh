#!/usr/bin/env bash
# End to end, 4-bit synthetic Mixtral-8x7B at B=4/16: the attention projections on cuBLAS against
# kernels/dense_mma.py, three interleaved rounds in one call (session 50 ran it on the H100:
# +2.5 % / +1.9 %), then the table at the shipped defaults.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/dense_mma_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
for r in a b c; do
  e2e_run 150 "cublas_r$r" --bits 4 --batches 4,16 --dense-mma-max-tokens 0
  e2e_run 60 "mma_r$r" --bits 4 --batches 4,16 --dense-mma-max-tokens 16
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_dense_mma_ab.json" | tail -5
timeout 270 python3 benchmarks/e2e_decode.py --preset mixtral-8x7b --bits 8,4,mixed26 --batches 1,16,64 \
  --commit "$C" --out "${OUT:-/tmp}/e2e_table.json" 2>&1 | tail -11
