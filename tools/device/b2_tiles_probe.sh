#!/usr/bin/env bash
# Prepared in session 63; its layer rows ran in session 64 (tools/device/s64_call.sh, answer in
# benchmarks/NOTES.md session 64: the CUDA-core tile loses wherever an expert holds two tokens).
# Session 63's question: B = 2-3, where choose_tiles takes the 8-token tensor-core tile (mean
# 1-1.5 tokens per expert) and the one-token CUDA-core tile ran 15-22 % faster at B=1 (s63_b1_tiles_h100.
# json). Under random routing an expert often holds two tokens (at B=2 on Mixtral, 46 % of steps by count), which
# the CUDA-core tile reads in two passes (Qwen B=4: +22 %, s63_small_h100.json). The layer, Mixtral then
# Qwen1.5-MoE, round robin then random: shipped / CUDA-core tile (block_m 1, no wide tile; Qwen on 64
# rows and 2 warps) / shipped, at B = 2 / 3, 4 and 2 bits. If the CUDA-core tile wins under random
# routing, choose_tiles can take it below a mean of ~1.5 tokens per expert; if it wins only under round
# robin, a two-token CUDA-core tile (decode once, two dp2a chains) is the thing to build. Then, where
# LIMIT leaves time, end to end (synthetic Mixtral-8x7B, its router's routing) at B = 2 / 3 / 4 with
# MoeTuning.cuda_core_max_tokens 4 against the shipped 1, rounds new old new old.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (560)] bash tools/device/b2_tiles_probe.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
A='{"use_asm":true}'
CM='{"use_asm":true,"block_m":1,"block_m_wide":0}'
CQ='{"use_asm":true,"block_m":1,"block_m_wide":0,"block_n":64,"num_warps":2}'
for route in roundrobin random; do
  timeout 100 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 90 --commit "$C" \
    --routing "$route" --tune-cases 2:4,2:2,3:4,3:2 --candidates "[$A,$CM,$A]" \
    --out "${OUT:-/tmp}/layer_b2_mixtral_$route.json" 2>&1 | grep "^tune" > "/tmp/m_$route.txt"
  timeout 70 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 60 --commit "$C" \
    --routing "$route" --tune-cases 2:4,2:2,3:4,3:2 --candidates "[$A,$CQ,$A]" \
    --out "${OUT:-/tmp}/layer_b2_qwen_$route.json" 2>&1 | grep "^tune" > "/tmp/q_$route.txt"
done
rm -rf /tmp/runs
for r in a b; do
  [[ $(left) -gt 140 ]] && e2e_run $(( ($(left) - 10) / 2 )) "cc4_r$r" --bits 4,mixed26 --batches 2,3,4 \
    --cuda-core-max-tokens 4
  [[ $(left) -gt 70 ]] && e2e_run $(( $(left) - 10 )) "cc1_r$r" --bits 4,mixed26 --batches 2,3,4
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_cuda_core_b2.json" > /tmp/e2e.txt 2>&1
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for route in roundrobin random; do
  echo "Mixtral $route 2:4,2:2,3:4,3:2"; cut -c1-200 "/tmp/m_$route.txt"
  echo "Qwen $route 2:4,2:2,3:4,3:2"; cut -c1-200 "/tmp/q_$route.txt"
done
tail -14 /tmp/e2e.txt
