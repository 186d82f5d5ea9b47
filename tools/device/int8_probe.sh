#!/usr/bin/env bash
# benchmarks/int8_product_probe.py on the lent card: the 4-bit step with fp16 against int8 products
# (and the copies alone) at 16 and 8 tokens, three interleaved rounds (~2 minutes fresh).
# Needs only torch and Triton (no carry). Usage: bash tools/device/int8_probe.sh <commit>
set -euo pipefail
forms=stream:16:4,fp16:16:4,int8:16:4,int8:16:3,int8:16:6,fp16:16:3,stream:8:4,fp16:8:4,int8:8:4
python3 benchmarks/int8_product_probe.py --configs "$forms" --rounds 3 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe.json"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
