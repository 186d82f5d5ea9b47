#!/usr/bin/env bash
# Session 52's first call, chosen by the card that comes. On an H200 (no H200 number since session
# 47): the end-to-end table at the shipped defaults (8 / 4-bit and whole-expert mixed 2/6 at B = 1 /
# 4 / 16 / 32 / 64), session 51's defaults against session 50's (tools/device/defaults_s51_ab.sh)
# and the GPU tests of the launches they changed. On an H100 (whose table session 51 measured):
# tools/device/narrow_b32_ab.sh, then the warm-up coverage test (tools/device/warm_coverage.sh).
# ~9 minutes. Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/first_s52.sh <commit>
C=$1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source .carry/on_device.sh || exit 1
  rm -rf /tmp/runs
  e2e_run 200 table --bits 8,4,mixed26 --batches 1,4,16,32,64
  python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_table.json" | tail -16
  rm -rf /tmp/runs
  bash tools/device/defaults_s51_ab.sh "$C"
else
  rm -rf /tmp/runs
  bash tools/device/narrow_b32_ab.sh "$C"
  bash tools/device/warm_coverage.sh 200
fi
