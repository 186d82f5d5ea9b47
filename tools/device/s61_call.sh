#!/usr/bin/env bash
# Session 61's call: MoeTiles.gate_up_apart (kernels/moe_combine.py), the gate/up launch without its
# combine and token-tile loop (local Triton 3.6 sm_90: 168 registers, 3 programs a multiprocessor,
# against 238 and 2), then a combine launch:
# 1. its GPU test at B = 16 (eager and graph replay; B = 48 and 1 last, where LIMIT >= 500 leaves time);
# 2. Mixtral 4-bit B=16 gate/up alone (benchmarks/block_matmul_probe.py): the engine as shipped,
#    apart (gate/up + combine), apart1 (one token tile an expert: no programs that exit at once), the
#    combine alone, the bare product `any`;
# 3. the layer A/B (bench_moe --tune-only, round-robin routing), the combine in against apart, A B A B in one
#    process, at B:bits $CASES (16:4,64:4,1:4), where LIMIT leaves time.
# Ran at 6e5428a (then the knob was MoeTuning.gate_up_apart, off, and the probe's form `engine`, the
# shipped launch, was today's `combined`), LIMIT=420 on an H100:
# benchmarks/results/s61_apart_probe_layer_h100.json.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] [CASES=B:bits,...] bash tools/device/s61_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
O=${OUT:-/tmp}
gpu_tests() {  # gpu_tests SECONDS [-k EXPR]
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_combine.py "${@:2}" 2>&1 | tail -2
}
gpu_tests 90 -k "8-0-0"
timeout 120 python3 benchmarks/block_matmul_probe.py --forms combined:4,apart:4,apart1:4,combine:4,any:4 --rounds 3 \
  --commit "$C" --out "$O/probe_apart.json" 2>&1 | grep -E "^\| [a-z]|Error|error" > /tmp/probe.txt
cat /tmp/probe.txt
A='{"use_asm":true,"tuning":{"gate_up_apart_max_tokens":0}}'  # the launch before
B='{"use_asm":true}'
TAIL=$(( LIMIT >= 500 ? 100 : 0 ))  # the other GPU tests after the A/B where LIMIT allows
if [[ $(left) -gt 60 ]]; then
  timeout $(( $(left) - 15 - TAIL )) python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check \
    --budget $(( $(left) - 25 - TAIL )) --commit "$C" --tune-cases ${CASES:-16:4,64:4,1:4} \
    --candidates "[$A,$B,$A,$B]" --out "$O/layer_apart_ab.json" 2>&1 | grep "^tune" > /tmp/ab.txt
fi
[[ $(left) -gt 60 ]] && gpu_tests $(( $(left) - 10 )) -k "not 8-0-0"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cat /tmp/probe.txt; cut -c1-200 /tmp/ab.txt
