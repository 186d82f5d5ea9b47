#!/usr/bin/env bash
# The end-to-end table of issue 5 at the shipped defaults: synthetic Mixtral-8x7B, 8 / 4-bit and
# whole-expert mixed 2/6, B = 1 / 4 / 16 / 32 / 64 (no H200 table since session 34's; session 52's
# one H200 call measured 4-bit B = 1 / 4 only). 300 s for a fresh machine's compiles. Then, on
# the same warm machine: tools/device/down_cost_small_ab.sh <commit> 1,4,16,32 (~6 minutes) and
# tools/device/layer_table.sh <commit> (~5 minutes). Usage, with carry [".carry", "pagedweight",
# ".whl"] after `make install proto` and tools/device/stage.sh:  bash tools/device/h200_table.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
e2e_run 420 table --bits 8,4,mixed26 --batches 1,4,16,32,64
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_table.json" | tail -16
