#!/usr/bin/env bash
# Session 66's device calls. MODE=table (the default on an H200): issue 5's end-to-end table with the
# transformers peer first (tools/device/s65_call.sh's H200 branch; call with needs_h200, the peer's
# bf16 weights are 93 GB). MODE=planes (the default elsewhere): all three h planes against
# MoeTuning.combine_one_plane by tools/device/tuning_ab.sh, test_moe_combine's GPU cases first, then
# the layer at $CASES (A B A B in one process), then end to end 4-bit and mixed 2/6 at B = 32 / 64
# where LIMIT leaves time. It ran in session 68 at 561e942 (s68_one_plane_h100.json); one plane is
# the default since, so from then the changed arm is all three planes. (The fp16 sums' A/B,
# s66_sums_fp16_h100.json, ran the same way at 693e27a: TESTS=True, tuning
# '{"gate_up_sums_fp16":true}', --gate-up-sums-fp16.)
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [MODE=table|planes] [LIMIT=seconds] bash tools/device/s66_call.sh <commit>
C=$1
H200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
MODE=${MODE:-$([[ $H200 -gt 0 ]] && echo table || echo planes)}
if [[ $MODE == table && $H200 -gt 0 ]]; then
  exec bash tools/device/s65_call.sh "$C"
fi
export CASES=${CASES:-16:4,32:4,64:4,64:2,64:8} LIMIT=${LIMIT:-550}
TESTS=gpu exec bash tools/device/tuning_ab.sh "$C" '{"combine_one_plane":false}' --no-combine-one-plane
