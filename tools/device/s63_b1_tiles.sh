#!/usr/bin/env bash
# Session 63: is the one-token CUDA-core tile still B=1's best? Its 2-bit loop is issue-bound (local
# SASS: 194 instructions per 128 weights a row, ~54 % of the issue slots at the copy's rate); the
# 8-token tensor-core tile has since reached 75-97 % of the copy at B=4. The layer (bench_moe
# --tune-only, round robin), Mixtral then Qwen1.5-MoE at B=1: shipped / block_m 8 / block_m 8 on
# 64 rows / block_m 16 / shipped; then B=64 under random routing with the down launch balanced
# (off with the wide tile since session 10; its loops now cost 0-7 instructions more a step).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s63_b1_tiles.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
O=${OUT:-/tmp}
A='{"use_asm":true}'
N8='{"use_asm":true,"block_m":8}'
N864='{"use_asm":true,"block_m":8,"block_n":64}'
N16='{"use_asm":true,"block_m":16}'
timeout 190 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 175 --commit "$C" \
  --tune-cases 1:2,1:4,1:8,1:mixed --candidates "[$A,$N8,$N864,$N16,$A]" \
  --out "$O/layer_b1_mixtral.json" 2>&1 | grep "^tune" > /tmp/mix.txt
timeout 130 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 115 --commit "$C" \
  --tune-cases 1:2,1:4,1:8 --candidates "[$A,$N8,$N864,$N16,$A]" \
  --out "$O/layer_b1_qwen.json" 2>&1 | grep "^tune" > /tmp/qwen.txt
timeout 130 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 115 --commit "$C" \
  --routing random --tune-cases 64:4,64:2,64:8 --candidates "[$A,{\"use_asm\":true,\"balance_down\":true},$A]" \
  --out "$O/layer_b64_balance.json" 2>&1 | grep "^tune" > /tmp/bal.txt
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "Mixtral B=1, cases 1:2,1:4,1:8,1:mixed"; cut -c1-220 /tmp/mix.txt
echo "Qwen B=1, cases 1:2,1:4,1:8"; cut -c1-220 /tmp/qwen.txt
echo "Mixtral B=64 random, 64:4,64:2,64:8"; cut -c1-220 /tmp/bal.txt
