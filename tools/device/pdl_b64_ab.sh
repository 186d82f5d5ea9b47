#!/usr/bin/env bash
# B=64 with its small launches in the PDL chain (session 50's knob, not yet run): end to end, 4-bit,
# two interleaved rounds of (a) the shipped defaults (no launch takes part past 16 rows, cuBLAS
# projections), (b) every launch but the MoE gate/up and down taking part, the projections on
# kernels/dense_mma.py, (c) every launch taking part (sessions 17-18 lost 1.5 % so, before the
# dense kernel). At B=16 chaining the projections gave +1.9 % (session 50, H100). ~5 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/pdl_b64_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
mkdir -p /tmp/runs
e2e() { timeout "$1" python3 benchmarks/e2e_decode.py --preset mixtral-8x7b --bits 4 --batches 64 --commit "$C" \
  --out "/tmp/runs/$2.json" "${@:3}" > "/tmp/runs/$2.log" 2>&1 || tail -3 "/tmp/runs/$2.log"; }
for r in a b; do
  e2e 150 "shipped_r$r"
  e2e 80 "small_r$r" --pdl-max-rows 64 --pdl-moe-weight-max-rows 16 --dense-mma-max-tokens 64
  e2e 80 "all_r$r" --pdl-max-rows 64 --dense-mma-max-tokens 64
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_pdl_b64_ab.json" | tail -4
