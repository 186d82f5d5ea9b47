#!/usr/bin/env bash
# Session 51: MoeTuning.gate_up_interleave at the batch sizes gate_up_interleave_ab.sh left out
# (B=1, 32, 64; 4-bit and whole-expert mixed 2/6), and B=32 with its small launches in the PDL
# chain (pdl_b64_ab.sh's "small": +0.4 % at B=64), two interleaved rounds, each against session 50's
# defaults (run at 3c470f3, where they were the defaults). ~5 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/interleave_b64_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
for r in a b; do
  e2e_run 150 "expert_major_r$r" --bits 4,mixed26 --batches 1,32,64 $S50_DEFAULTS
  e2e_run 100 "interleaved_r$r" --bits 4,mixed26 --batches 1,32,64 $S50_DEFAULTS --gate-up-interleave-max-tokens 64
  e2e_run 60 "pdl_small_r$r" --bits 4 --batches 32 --pdl-max-rows 64 --pdl-moe-weight-max-rows 16 \
    --dense-mma-max-tokens 64 --gate-up-interleave-max-tokens 0
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_interleave_b64_ab.json" | tail -14
