#!/usr/bin/env bash
# B=64 with its small launches in the PDL chain (session 50's knob; run in session 51, which made
# (b) the default): end to end, 4-bit, two interleaved rounds of (a) session 50's defaults (no
# launch takes part past 16 rows, cuBLAS projections: "shipped" when it ran), (b) every launch but
# the MoE gate/up and down taking part, the projections on kernels/dense_mma.py, (c) every launch
# taking part (sessions 17-18 lost 1.5 % so, before the dense kernel). ~5 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/pdl_b64_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
for r in a b; do
  e2e_run 150 "shipped_r$r" --bits 4 --batches 64 $S50_DEFAULTS
  e2e_run 80 "small_r$r" --bits 4 --batches 64 --pdl-max-rows 64 --pdl-moe-weight-max-rows 16 --dense-mma-max-tokens 64
  e2e_run 80 "all_r$r" --bits 4 --batches 64 --pdl-max-rows 64 --pdl-moe-weight-max-rows 64 --dense-mma-max-tokens 64
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_pdl_b64_ab.json" | tail -4
