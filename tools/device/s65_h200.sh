#!/usr/bin/env bash
# Session 65: issue 5's end-to-end table on an H200 (none since session 56) with the transformers
# peer in the same call; on any other card nothing runs. About 9 minutes on a fresh machine.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s65_h200.sh <commit>
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); nothing run"
  exit 0
fi
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
e2e_run 400 table --bits 8,4,mixed26 --batches 1,4,16,32,64
timeout 100 python3 benchmarks/e2e_peer_hf.py --batches 1,16 --steps 16 --commit "$C" \
  --out "${OUT:-/tmp}/e2e_peer.json" 2>&1 | tail -4
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_table.json" | tail -16
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
