#!/usr/bin/env bash
# Session 60's short call (LIMIT + ~10 s; not run), when too little device time is left for s60_call.sh's
# end-to-end rounds: 1. Mixtral 4-bit B=16 gate/up alone (benchmarks/block_matmul_probe.py): the engine's
# launch as shipped (opaque rows), capped at 168 registers (3 programs a multiprocessor, gate/up alone:
# the layer A/B capped both launches), and the bare product `any`; 2. the fused layer's GPU tests.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (230)] bash tools/device/s60_last.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-230}
left() { echo $((LIMIT - SECONDS)); }
FORMS=engine:4,engine168:4; [[ $LIMIT -ge 150 ]] && FORMS+=,any:4  # any: 183.7 us in session 60's first call
timeout $(( LIMIT < 100 ? LIMIT - 5 : 90 )) python3 benchmarks/block_matmul_probe.py --forms $FORMS --rounds 3 \
  --commit "$C" --out "${OUT:-/tmp}/block_matmul_probe_cap.json" 2>&1 | grep -E "^\| [a-z]|Error|error"
[[ $(left) -gt 40 ]] && timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/kernels/test_moe_mixed.py 2>&1 | tail -3
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
