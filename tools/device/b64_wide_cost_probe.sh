#!/usr/bin/env bash
# Session 52 (prepared, not run): what compiling the 32-token wide tile into B=64's launches costs.
# Round robin (every expert exactly 16 tokens, so no program takes the wide tile) B=64 4-bit gate/up
# ran 270.1 us against B=16's 208.6 (8-token tile) on the same bytes (moe_table_h100_s52.json); the
# 16-token loops' instruction counts are the same with and without it (local SASS), while the
# stages (3 against 4) and the stack (448 against 216 bytes) differ. The layer, Mixtral, round robin
# then random routing, round robin of shipped (16 + wide 32, 3 stages) / no wide tile (an expert
# over 16 tokens takes a second pass; the down launch then balanced) at 3 and 4 stages / wide at 4
# stages / shipped. ~3 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/b64_wide_cost_probe.sh <commit>
source .carry/on_device.sh || exit 1
BASE='"block_n":128,"num_warps":4,"use_asm":true'
CANDS="[{$BASE},{$BASE,\"block_m\":16,\"block_m_wide\":0,\"num_stages\":3},"
CANDS+="{$BASE,\"block_m\":16,\"block_m_wide\":0,\"num_stages\":4},{$BASE,\"num_stages\":4,\"wide_stages\":4},{$BASE}]"
for route in roundrobin random; do
  echo "routing $route"
  timeout 100 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 90 --commit "$1" \
    --routing "$route" --tune-cases 64:4,64:2,64:8 --candidates "$CANDS" \
    --out "${OUT:-/tmp}/moe_b64_wide_cost_$route.json" 2>&1 | grep "^tune" | tail -5
done
