#!/usr/bin/env bash
# Session 60's second call (LIMIT + ~10 s; not run: no machine started for it), after the opaque rows
# were adopted (kernels/moe_block_matmul.rows_of_tile; session 60's H100 layer A/B, Mixtral 4-bit
# B = 16 / 64: 310.3 / 361.9 -> 299.0 / 352.8 us):
# 1. Mixtral 4-bit B=16 gate/up alone (benchmarks/block_matmul_probe.py): the engine's launch as shipped,
#    capped at 168 registers (3 programs a multiprocessor, gate/up alone; the layer A/B capped both
#    launches and lost 15 %), and the bare product `any` (168 registers by itself);
# 2. end to end, synthetic Mixtral-8x7B, 4-bit and whole-expert mixed 2/6 at B = 1 / 16 / 64: the tree
#    (opaque) against a copy with tools/device/patches/hoisted_rows.py (hoisted: the launches before),
#    rounds a, then b where LIMIT leaves time; skipped under 300 s of LIMIT;
# 3. the fused layer's GPU tests at the tree, where time is left.
# Under 480 s of LIMIT the probe runs after the first round (under 300 s, first and without `any`).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] [ARGS=e2e_decode.py flags] bash tools/device/s60_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
merge() { python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_opaque_rows_ab.json" > /tmp/table.txt; }
probe() {  # probe SECONDS FORMS
  timeout "$1" python3 benchmarks/block_matmul_probe.py --forms "$2" --rounds 3 --commit "$C" \
    --out "${OUT:-/tmp}/block_matmul_probe_cap.json" 2>&1 | grep -E "^\| [a-z]|Error|error"
}
gpu_tests() {
  [[ $(left) -gt 40 ]] && timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_moe_mixed.py 2>&1 | tail -2
}
FORMS=engine:4,engine168:4,any:4
if [[ $LIMIT -lt 300 ]]; then  # any: 183.7 us in session 60's first call
  probe $(( LIMIT < 100 ? LIMIT - 5 : 90 )) engine:4,engine168:4; gpu_tests
else
  rm -rf /tmp/runs /tmp/a && cp -r . /tmp/a && (cd /tmp/a && python3 tools/device/patches/hoisted_rows.py) || exit 1
  ARGS=${ARGS:-"--bits 4,mixed26 --batches 1,16,64"}
  [[ $LIMIT -ge 480 ]] && probe 80 $FORMS
  e2e_run 170 opaque_ra $ARGS; merge
  [[ $(left) -gt 40 ]] && (cd /tmp/a && C="$C+hoisted_rows" \
    e2e_run $(( $(left) < 160 ? $(left) - 10 : 150 )) hoisted_ra $ARGS)
  merge
  [[ $LIMIT -lt 480 && $(left) -gt 70 ]] && probe 70 $FORMS
  [[ $(left) -gt 150 ]] && e2e_run 70 opaque_rb $ARGS && (cd /tmp/a && C="$C+hoisted_rows" e2e_run 70 hoisted_rb $ARGS)
  merge; tail -14 /tmp/table.txt
  gpu_tests
fi
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
