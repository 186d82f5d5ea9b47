#!/usr/bin/env bash
# Session 59's first call (~4 minutes fresh), Mixtral-8x7B gate/up at 4 bits, B = 16, on one card:
# 1. the engine's product in a bare launch against the engine's launch (benchmarks/block_matmul_probe.py:
#    engine, any, nf3);
# 2. session 58's unrun skeleton forms (benchmarks/int8_product_probe.py: fp16 / fields / int8 at 8 and
#    16 tokens; fp16 and fields also at 2 programs per multiprocessor looping over the tiles, the
#    engine's occupancy);
# 3. the engine's layer with each launch timed alone (bench_moe's stage rows).
# Torch and Triton only. Usage: bash tools/device/s59_call.sh <commit>
set -uo pipefail
timeout 170 python3 benchmarks/block_matmul_probe.py --forms engine:4,any:4,nf3:4 --rounds 3 --commit "$1" \
  --out "${OUT:-/tmp}/block_matmul_probe_b16.json" 2>&1 | tail -6
forms=fp16:8:4,fp16:8:4:2,fields:8:4,fields:8:4:2,int8:8:4,fp16:16:4,fp16:16:4:2,int8:16:4
timeout 200 python3 benchmarks/int8_product_probe.py --configs "$forms" --rounds 2 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe_occupancy.json" | tail -12
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --bits 4 --batches 16 --kernels-only --no-check \
  --budget 180 --commit "$1" --out "${OUT:-/tmp}/moe_b16_stages.json" 2>&1 | grep -v "^ *$" | tail -4
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print('stage_us', x.get('stage_us')) for x in r['moe'] if isinstance(x, dict) and 'stage_us' in x]" "${OUT:-/tmp}/moe_b16_stages.json"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
