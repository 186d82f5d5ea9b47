#!/usr/bin/env bash
# Session 63: the small, latency-bound layers. (1) Qwen1.5-MoE at B=1 with the one-token gate/up and
# down in one launch (MoeTuning.one_token_one_launch; measured slower only on Mixtral); (2) the
# one-token CUDA-core tile at B=4, where round robin gives every expert one token (Qwen: 16 experts,
# Mixtral: 8) and the shipped 8-token tensor-core tile pads 7 of 8 columns: on 64 rows and 2 warps
# (as Qwen's B=1) and on 128 rows and 4 warps; then Qwen B=4 under random routing (an expert may get
# 2 tokens: the CUDA-core tile makes two passes). Layer, bench_moe --tune-only, us per layer.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s63_small.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
O=${OUT:-/tmp}
A='{"use_asm":true}'
OL='{"use_asm":true,"tuning":{"one_token_one_launch":true}}'
C64='{"use_asm":true,"block_m":1,"block_m_wide":0,"block_n":64,"num_warps":2}'
C128='{"use_asm":true,"block_m":1,"block_m_wide":0}'
timeout 130 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 120 --commit "$C" \
  --tune-cases 1:4,1:2,4:4,4:2,4:8,4:mixed --candidates "[$A,$OL,$C64,$C128,$A]" \
  --out "$O/layer_small_qwen.json" 2>&1 | grep "^tune" > /tmp/qwen.txt
timeout 90 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 80 --commit "$C" \
  --tune-cases 4:4,4:2,4:8 --candidates "[$A,$C128,$A]" \
  --out "$O/layer_small_mixtral.json" 2>&1 | grep "^tune" > /tmp/mix.txt
timeout 60 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 50 --commit "$C" \
  --routing random --tune-cases 4:4,4:2 --candidates "[$A,$C64,$C128,$A]" \
  --out "$O/layer_small_qwen_random.json" 2>&1 | grep "^tune" > /tmp/qr.txt
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "Qwen round robin 1:4,1:2,4:4,4:2,4:8,4:mixed"; cut -c1-240 /tmp/qwen.txt
echo "Mixtral round robin 4:4,4:2,4:8"; cut -c1-200 /tmp/mix.txt
echo "Qwen random 4:4,4:2"; cut -c1-200 /tmp/qr.txt
