#!/usr/bin/env bash
# A/B of one MoeTuning change on the lent card, shipped tiles (A) against the change (B):
# 1. GPU tests of tests/kernels/test_moe_combine.py matching $TESTS (a pytest -k expression; none if empty);
# 2. the layer (bench_moe --tune-only, Mixtral, round-robin routing) at B:bits $CASES, A B A B in one process;
# 3. end to end, synthetic Mixtral-8x7B, $E2E_ARGS, with the change's e2e_decode.py flags and without,
#    where LIMIT leaves time.
# Session 62 ran the register cap this way (then tools/device/s62_cap.sh, at e6ebd62, with a third
# candidate); session 63 the paired gate/up launch (removed after it), as:
#   TESTS=True bash tools/device/tuning_ab.sh <commit> '{"base_tile_gate_up_paired":true}' --base-tile-gate-up-paired
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (560)] [CASES=B:bits,...] [E2E_ARGS=...] [TESTS=expr] bash tools/device/tuning_ab.sh \
#     <commit> <tuning JSON> <e2e_decode.py flags of the change>
source .carry/on_device.sh || exit 1
C=$1; TUNING=$2; FLAGS=$3
LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
O=${OUT:-/tmp}
[[ -n "${TESTS:-}" ]] && timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/kernels/test_moe_combine.py -k "$TESTS" 2>&1 | tail -1
A='{"use_asm":true}'
B="{\"use_asm\":true,\"tuning\":$TUNING}"
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --tune-only --no-check --budget 185 --commit "$C" \
  --tune-cases ${CASES:-32:4,64:4,64:2,64:8,48:4} --candidates "[$A,$B,$A,$B]" \
  --out "$O/layer_tuning_ab.json" 2>&1 | grep "^tune" > /tmp/ab.txt
cat /tmp/ab.txt
rm -rf /tmp/runs
E2E_ARGS=${E2E_ARGS:-"--bits 4,mixed26 --batches 32,64"}
if [[ $(left) -gt 150 ]]; then
  e2e_run $(( ($(left) - 20) / 2 )) changed_ra $E2E_ARGS $FLAGS
  e2e_run $(( $(left) - 20 )) base_ra $E2E_ARGS
  python3 benchmarks/merge_runs.py /tmp/runs "$O/e2e_tuning_ab.json" > /tmp/table.txt
fi
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cut -c1-200 /tmp/ab.txt; tail -10 /tmp/table.txt 2>/dev/null
