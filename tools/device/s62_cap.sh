#!/usr/bin/env bash
# Session 62's call: the apart gate/up launch of the 16-token tile capped at 168 registers
# (MoeTuning.base_tile_gate_up_maxnreg -> MoeTiles.gate_up_maxnreg; local sm_90 SASS: 214 registers,
# 2 programs a multiprocessor -> 168 + 96 B of stack outside the loops, 3 programs):
# 1. its GPU test (the B=48 tiles with the cap: eager and graph replay);
# 2. the layer A/B (bench_moe --tune-only, round-robin routing) at B:bits $CASES: A shipped, B the gate/up
#    cap, C both weight launches at 168 (choose_tiles' maxnreg), A B C A B C in one process;
# 3. end to end, synthetic Mixtral-8x7B, $E2E_ARGS, capped and not, where LIMIT leaves time.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (560)] [CASES=B:bits,...] [E2E_ARGS=e2e_decode.py flags] bash tools/device/s62_cap.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
O=${OUT:-/tmp}
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_combine.py -k "168" 2>&1 | tail -1
A='{"use_asm":true}'
B='{"use_asm":true,"tuning":{"base_tile_gate_up_maxnreg":168}}'
BOTH='{"use_asm":true,"maxnreg":168}'
timeout 240 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 225 --commit "$C" \
  --tune-cases ${CASES:-32:4,64:4,64:2,64:8,32:2} --candidates "[$A,$B,$BOTH,$A,$B,$BOTH]" \
  --out "$O/layer_cap_ab.json" 2>&1 | grep "^tune" > /tmp/ab.txt
cat /tmp/ab.txt
rm -rf /tmp/runs
E2E_ARGS=${E2E_ARGS:-"--bits 4,mixed26 --batches 32,64"}
if [[ $(left) -gt 150 ]]; then
  e2e_run $(( ($(left) - 20) / 2 )) capped_ra $E2E_ARGS --base-tile-gate-up-maxnreg 168
  e2e_run $(( $(left) - 20 )) base_ra $E2E_ARGS
  python3 benchmarks/merge_runs.py /tmp/runs "$O/e2e_cap_s62.json" > /tmp/table.txt
fi
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cut -c1-200 /tmp/ab.txt; tail -10 /tmp/table.txt 2>/dev/null
