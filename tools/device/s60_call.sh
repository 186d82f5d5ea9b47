#!/usr/bin/env bash
# Session 60's end-to-end A/B of the opaque rows (kernels/moe_gate_up.py, moe_down.py; adopted after
# session 60's H100 layer A/B: Mixtral 4-bit, B = 16 / 64, 310.3 / 361.9 -> 299.0 / 352.8 us):
# synthetic Mixtral-8x7B, 4-bit and whole-expert mixed 2/6 at B = 1 / 16 / 64, the tree (B) against a
# copy with tools/device/patches/hoisted_rows.py (A, the launches before), rounds B A B A as LIMIT
# allows; first the fused layer's GPU tests at the tree. Usage, with carry [".carry", "pagedweight",
# ".whl"] after `make proto` and tools/device/stage.sh:  [LIMIT=seconds (540)] bash tools/device/s60_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
rm -rf /tmp/runs /tmp/a && cp -r . /tmp/a && (cd /tmp/a && python3 tools/device/patches/hoisted_rows.py) || exit 1
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py 2>&1 | tail -3
ARGS="--bits 4,mixed26 --batches 1,16,64"
e2e_run 170 opaque_ra $ARGS
(cd /tmp/a && C="$C+hoisted_rows" e2e_run 150 hoisted_ra $ARGS)
[[ $(left) -gt 100 ]] && e2e_run $(( $(left) / 2 )) opaque_rb $ARGS
[[ $(left) -gt 50 ]] && (cd /tmp/a && C="$C+hoisted_rows" e2e_run $(( $(left) - 10 )) hoisted_rb $ARGS)
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_opaque_rows_ab.json" | tail -14
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
