#!/usr/bin/env bash
# Session 64: the end-to-end table of issue 5 (tools/device/h200_table.sh) if the card that came is
# an H200 (none since session 56); on any other card nothing runs, so that the session's last device
# time is spent on the H200 only. Usage, with carry [".carry", "pagedweight", ".whl"] after
# `make proto` and tools/device/stage.sh:  [SHORT=seconds] bash tools/device/s64_h200.sh <commit>
# (SHORT: 8 and 4 bits at B = 1 / 16 / 64 only, in that many seconds)
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); nothing run"
  exit 0
fi
if [[ -n "$SHORT" ]]; then
  # What device time is left for: the rows only (4 and 8 bits, B = 1 / 16 / 64).
  source .carry/on_device.sh || exit 1
  C=$1
  rm -rf /tmp/runs
  e2e_run "$SHORT" table --bits 8,4 --batches 1,16,64
  python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_table.json" | tail -10
else
  bash tools/device/h200_table.sh "$1"
fi
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
