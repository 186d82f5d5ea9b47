#!/usr/bin/env bash
# Session 51's defaults (the gate/up grid row tile major up to 32 tokens; past 16 rows the small
# launches in the PDL chain and the projections on dense_mma) against session 50's, end to end,
# 4-bit and whole-expert mixed 2/6 at B=4/16/32/64, two interleaved rounds. ~5 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/defaults_s51_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
for r in a b; do
  e2e_run 150 "s50_r$r" --bits 4,mixed26 --batches 4,16,32,64 $S50_DEFAULTS
  e2e_run 110 "s51_r$r" --bits 4,mixed26 --batches 4,16,32,64
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_defaults_s51_ab.json" | tail -17
# The GPU tests of the launches whose defaults changed (decode graphs at B past 16, dense_mma, PDL).
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/dataplane/test_dp_decode_graphs.py \
  tests/dataplane/test_dp_dense_mma.py tests/kernels/test_pdl.py 2>&1 | tail -3
