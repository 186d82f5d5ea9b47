#!/usr/bin/env bash
# Session 62's call: MoeTiles.gate_up_combine_appended, the apart gate/up launch's combine as programs
# appended to its grid (each waiting on its tile's arrival count) instead of a launch after it:
# 1. its GPU tests at B = 16 (eager and graph replay; the others last, where LIMIT >= 500 leaves time);
# 2. Mixtral 4-bit B=16 gate/up alone (benchmarks/block_matmul_probe.py): apart (gate/up + combine
#    launch), appended, the combine launch alone, the bare product `any`;
# 3. the layer A/B (bench_moe --tune-only, round-robin routing), apart against appended, A B A B in one
#    process, at B:bits $CASES, where LIMIT leaves time.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] [CASES=B:bits,...] bash tools/device/s62_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
O=${OUT:-/tmp}
gpu_tests() {  # gpu_tests SECONDS [-k EXPR]
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_combine.py "${@:2}" 2>&1 | tail -2
}
gpu_tests 100 -k "8-0-0"
timeout 120 python3 benchmarks/block_matmul_probe.py --forms apart:4,appended:4,combine:4,any:4 --rounds 3 \
  --commit "$C" --out "$O/probe_appended.json" 2>&1 | grep -E "^\| [a-z]|Error|error" > /tmp/probe.txt
cat /tmp/probe.txt
A='{"use_asm":true,"tuning":{"gate_up_combine_appended":false}}'
B='{"use_asm":true,"tuning":{"gate_up_combine_appended":true}}'
TAIL=$(( LIMIT >= 500 ? 100 : 0 ))  # the other GPU tests after the A/B where LIMIT allows
if [[ $(left) -gt 60 ]]; then
  timeout $(( $(left) - 15 - TAIL )) python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check \
    --budget $(( $(left) - 25 - TAIL )) --commit "$C" --tune-cases ${CASES:-16:4,64:4,4:4,32:4,16:2,64:2} \
    --candidates "[$A,$B,$A,$B]" --out "$O/layer_appended_ab.json" 2>&1 | grep "^tune" > /tmp/ab.txt
fi
[[ $(left) -gt 60 ]] && gpu_tests $(( $(left) - 10 )) -k "not 8-0-0"
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cat /tmp/probe.txt; cut -c1-200 /tmp/ab.txt
