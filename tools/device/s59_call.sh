#!/usr/bin/env bash
# Session 59's first call (~3 minutes fresh): session 58's unrun probe forms (fp16 / fields / int8 at 8
# and 16 tokens, fp16 and fields also at 2 programs per multiprocessor looping over the tiles: the
# engine's occupancy), then on the same card the engine's Mixtral 4-bit B=16 layer with each launch
# timed alone (bench_moe's stage rows), so that the probe and the engine's gate/up compare on one card.
# Torch and Triton only. Usage: bash tools/device/s59_call.sh <commit>
set -uo pipefail
forms=fp16:8:4,fp16:8:4:2,fields:8:4,fields:8:4:2,int8:8:4,fp16:16:4,fp16:16:4:2,int8:16:4
timeout 200 python3 benchmarks/int8_product_probe.py --configs "$forms" --rounds 2 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe_occupancy.json" | tail -12
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --bits 4 --batches 16 --kernels-only --no-check \
  --budget 180 --commit "$1" --out "${OUT:-/tmp}/moe_b16_stages.json" 2>&1 | grep -v "^ *$" | tail -4
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print('stage_us', x.get('stage_us')) for x in r['moe'] if isinstance(x, dict) and 'stage_us' in x]" "${OUT:-/tmp}/moe_b16_stages.json"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
