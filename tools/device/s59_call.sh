#!/usr/bin/env bash
# Session 59's first call (LIMIT + ~10 s), Mixtral-8x7B gate/up at 4 bits, B = 16, on one card:
# 1. the engine's product in a bare launch against the engine's launch (benchmarks/block_matmul_probe.py:
#    engine, any, nf3);
# 2. session 58's unrun skeleton forms at 8 tokens (benchmarks/int8_product_probe.py: fp16 and the
#    engine's three-field read, each also at 2 programs per multiprocessor looping over the tiles: the
#    engine's occupancy);
# 3. the engine's launch with tools/device/patches/opaque_rows.py (the gate/up and down row indices made
#    to depend on the token tile, so that the page bases are not hoisted out of the token-tile loop:
#    local SASS, 8-token tile, gate/up 255 registers + 48 B stack -> 238 + 0, 4-bit step 261 -> 253
#    instructions; down 255 -> 209) in the probe's engine form, B then A again;
# 4. the opaque-rows A/B on the layer (tools/device/s59_ab.sh), B also capped at 168 registers.
# Each step only where LIMIT leaves it time.
# Ran at 2073e5a on an H100 (session 60, benchmarks/results/s60_probe_ab_h100.json); the opaque rows are in
# kernels/ since e8230f1, where step 3's patch adds a second, idle zero.
# Torch and Triton only. Usage: [LIMIT=seconds (580)] bash tools/device/s59_call.sh <commit>
set -uo pipefail
LIMIT=${LIMIT:-580}
rm -rf /tmp/b && mkdir /tmp/b && cp -r benchmarks kernels tools /tmp/b/ && (cd /tmp/b && python3 tools/device/patches/opaque_rows.py)
probe() {  # probe DIR TAG FORMS
  (cd "$1" && timeout 120 python3 benchmarks/block_matmul_probe.py --forms "$3" --rounds 3 --commit "$C+$2" \
    --out "${OUT:-/tmp}/block_matmul_probe_b16_$2.json" 2>&1 | grep -E "^\| [a-z]|Error|error" | sed "s/^/$2 /")
}
C=$1
left() { echo $((LIMIT - SECONDS)); }
probe . A engine:4,any:4,nf3:4
[[ $(left) -gt 90 ]] && timeout $(( $(left) < 100 ? $(left) - 5 : 100 )) python3 benchmarks/int8_product_probe.py \
  --configs fp16:8:4,fp16:8:4:2,fields:8:4,fields:8:4:2 --rounds 2 --commit "$1" \
  --out "${OUT:-/tmp}/int8_product_probe_occupancy.json" | tail -5
[[ $(left) -gt 100 ]] && probe /tmp/b B engine:4 && probe . A2 engine:4
[[ $(left) -gt 150 ]] && bash tools/device/s59_ab.sh "$1" opaque_rows.py 16:4,64:4 "$(left)" \
  '[{"use_asm":true},{"use_asm":true,"maxnreg":168}]'  # B also at 3 programs (local SASS: 4-bit step 268, no LDL)
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
