#!/usr/bin/env bash
# Session 64's first call. (1) The one-token down launch on 3 programs a multiprocessor
# (MoeTuning.one_token_down_programs: since session 59 it compiles to 158 registers, so 3 fit;
# Mixtral B=1 split 6 = 384 programs for 396 places instead of 4 = 256 for 264), and Qwen1.5-MoE's
# on 6 (2 warps); the layer, shipped and tuned alternating. (2) tools/device/b2_tiles_probe.sh's
# layer rows with shorter budgets (B = 2-3, shipped / the one-token CUDA-core tile; Mixtral round
# robin and random routing, Qwen random only). (3) Qwen1.5-MoE at B = 32-64 on the 8-token tile (mean 4.3 tokens an expert at
# B=64, just over MoeTuning.narrow_tile_max_mean's 4, so the shipped takes the 16-token tile), random
# routing. (4) Where LIMIT leaves time, end to end B=1 with the down knob at 3 against the
# shipped, rounds new old new old. First the split-6 case of the GPU one-token test. bench_moe --tune-only, us per layer.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] bash tools/device/s64_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
O=${OUT:-/tmp}
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
A='{"use_asm":true}'
D3='{"use_asm":true,"tuning":{"one_token_down_programs":3}}'
D6='{"use_asm":true,"tuning":{"one_token_down_programs":6}}'
CM='{"use_asm":true,"block_m":1,"block_m_wide":0}'
CQ='{"use_asm":true,"block_m":1,"block_m_wide":0,"block_n":64,"num_warps":2}'
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
  -k "test_gpu_cuda_core_tile_one_token_and_replay and 128-4-1-6" 2>&1 | tail -2 > /tmp/gpu_test.txt
timeout 100 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 90 --commit "$C" \
  --tune-cases 1:4,1:2,1:8,1:mixed --candidates "[$A,$D3,$A,$D3]" \
  --out "$O/layer_down3_mixtral.json" 2>&1 | grep "^tune" > /tmp/d_m.txt
for route in roundrobin random; do
  timeout 75 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 65 --commit "$C" \
    --routing "$route" --tune-cases 2:4,2:2,3:4,3:2 --candidates "[$A,$CM,$A]" \
    --out "$O/layer_b2_mixtral_$route.json" 2>&1 | grep "^tune" > "/tmp/m_$route.txt"
done
N8='{"use_asm":true,"block_m":8}'
timeout 60 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 50 --commit "$C" \
  --routing random --tune-cases 64:4,64:2,64:8,32:4 --candidates "[$A,$N8,$A]" \
  --out "$O/layer_narrow_qwen_b64.json" 2>&1 | grep "^tune" > /tmp/n_q.txt
timeout 50 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check --budget 40 --commit "$C" \
  --routing random --tune-cases 2:4,2:2,3:4,3:2 --candidates "[$A,$CQ,$A]" \
  --out "$O/layer_b2_qwen_random.json" 2>&1 | grep "^tune" > /tmp/q_random.txt
[[ $(left) -gt 200 ]] && timeout 50 python3 benchmarks/bench_moe.py --models qwen --tune-only --no-check \
  --budget 40 --commit "$C" --tune-cases 1:4,1:2,1:8 --candidates "[$A,$D6,$A]" \
  --out "$O/layer_down6_qwen.json" 2>&1 | grep "^tune" > /tmp/d_q.txt
rm -rf /tmp/runs
for r in a b; do
  [[ $(left) -gt 130 ]] && e2e_run $(( ($(left) - 10) / 2 )) "d3_r$r" --bits 4,mixed26 --batches 1 \
    --one-token-down-programs 3
  [[ $(left) -gt 65 ]] && e2e_run $(( $(left) - 10 )) "d0_r$r" --bits 4,mixed26 --batches 1
done
python3 benchmarks/merge_runs.py /tmp/runs "$O/e2e_down3_b1.json" > /tmp/e2e.txt 2>&1
cat /tmp/gpu_test.txt
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "Mixtral B=1 1:4,1:2,1:8,1:mixed shipped / down 3 / shipped / down 3"; cut -c1-220 /tmp/d_m.txt
echo "Qwen B=1 1:4,1:2,1:8 shipped / down 6 / shipped"; cut -c1-200 /tmp/d_q.txt
for route in roundrobin random; do
  echo "Mixtral $route 2:4,2:2,3:4,3:2 shipped / cuda-core / shipped"; cut -c1-200 "/tmp/m_$route.txt"
done
echo "Qwen random 2:4,2:2,3:4,3:2"; cut -c1-200 /tmp/q_random.txt
echo "Qwen random 64:4,64:2,64:8,32:4 shipped / 8-token / shipped"; cut -c1-200 /tmp/n_q.txt
tail -8 /tmp/e2e.txt
