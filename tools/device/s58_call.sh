#!/usr/bin/env bash
# Session 58's second call: the probe's skeleton at 8 and 16 tokens (fp16, the engine's three-field
# read and decode, int8), each also with 2 programs per multiprocessor looping over the tiles (the
# engine's occupancy: 255 registers), two interleaved rounds (~2 minutes fresh). Torch and Triton only.
# Usage: bash tools/device/s58_call.sh <commit>
set -euo pipefail
forms=fp16:8:4,fp16:8:4:2,fields:8:4,fields:8:4:2,int8:8:4,fp16:16:4,fp16:16:4:2,int8:16:4
timeout 200 python3 benchmarks/int8_product_probe.py --configs "$forms" --rounds 2 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe_occupancy.json"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
