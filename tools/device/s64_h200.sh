#!/usr/bin/env bash
# Session 64: the end-to-end table of issue 5 (tools/device/h200_table.sh) if the card that came is
# an H200 (none since session 56); on any other card nothing runs, so that the session's last device
# time is spent on the H200 only. Usage, with carry [".carry", "pagedweight", ".whl"] after
# `make proto` and tools/device/stage.sh:  bash tools/device/s64_h200.sh <commit>
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); nothing run"
  exit 0
fi
bash tools/device/h200_table.sh "$1"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
