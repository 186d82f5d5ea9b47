#!/usr/bin/env bash
# Session 63's last call: the issue-5 layer table at HEAD (tools/device/layer_table.sh: Mixtral and
# Qwen1.5-MoE, 8/6/4/3/2-bit and mixed, B = 1/4/16/64), then the cost of mixing at B=1 (uniform 4-bit
# against whole-expert mixed 2/6, end to end, rounds where time is left; session 62: -2.3 %).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (560)] bash tools/device/s63_tables.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
timeout 345 python3 benchmarks/bench_moe.py --models mixtral,qwen --bits 8,6,4,3,2,mixed \
  --batches 1,4,16,64 --stage-bits 4,mixed --kernels-only --no-check --budget 330 --commit "$C" \
  --out "${OUT:-/tmp}/moe_table.json" 2>&1 | grep -v "^ *$" | tail -60 > /tmp/layer.txt
rm -rf /tmp/runs
for r in a b c; do
  [[ $(left) -gt 75 ]] && e2e_run $(( $(left) - 10 )) "cost_r$r" --bits 4,mixed26 --batches 1
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_mixed_cost_b1.json" > /tmp/cost.txt
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cut -c1-160 /tmp/layer.txt | tail -48
tail -3 /tmp/cost.txt
