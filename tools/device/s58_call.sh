#!/usr/bin/env bash
# Session 58's second call: the probe's skeleton (fp16, the engine's three-field read and decode, int8,
# the copies) at 8 and 16 tokens, then the engine's own gate/up launch alone at Mixtral 4-bit B=16
# (bench_moe's stage rows), so that the probe's GB/s and the engine's read on one card.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s58_call.sh <commit>
source .carry/on_device.sh || exit 1
forms=fp16:8:4,fields:8:4,int8:8:4,fp16:16:4,fields:16:4,int8:16:4
timeout 110 python3 benchmarks/int8_product_probe.py --configs "$forms" --rounds 2 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe_fields.json"
timeout 150 python3 benchmarks/bench_moe.py --models mixtral --bits 4 --batches 16 --stage-bits 4 --kernels-only \
  --no-check --budget 130 --commit "$1" --out "${OUT:-/tmp}/moe_b16_stages.json" 2>&1 | grep -v "^ *$" | tail -8
python3 - "${OUT:-/tmp}/moe_b16_stages.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def walk(o):
    if isinstance(o, dict):
        if "stage_us" in o:
            print("engine stages (us):", o.get("batch"), o.get("bits"), o["stage_us"])
        for v in o.values():
            walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(d)
PY
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
