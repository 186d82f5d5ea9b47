#!/usr/bin/env bash
# Prepared in session 55, not run: the down launch split by token class on two streams
# (MoeTuning.wide_down_split_stages, MoeTiles.down_split_stages; off), as the gate/up split that
# session 55 adopted (+2.2-4.8 % end to end at B = 48-64 on the H100). First the GPU test of both
# splits, then the layer, Mixtral, random routing, B = 48 / 56 / 64 at 4 / 2 / 8 bits, round robin
# of shipped / down split at 4 stages / at 3 / shipped; then end to end, B = 48 / 56 / 64, 4-bit and
# mixed 2/6, two interleaved rounds of shipped against down split 4. ~7 minutes on a fresh machine
# (limit 560 s).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/down_split_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mixed.py \
  -k "loaded_experts_with_and_without_wide_tile" 2>&1 | tail -2
BASE='"block_n":128,"num_warps":4,"use_asm":true'
CANDS="[{$BASE},{$BASE,\"tuning\":{\"wide_down_split_stages\":4}},"
CANDS+="{$BASE,\"tuning\":{\"wide_down_split_stages\":3}},{$BASE}]"
timeout 90 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 80 --commit "$C" \
  --routing random --tune-cases 48:4,56:4,64:4,64:2,64:8 --candidates "$CANDS" \
  --out "${OUT:-/tmp}/moe_down_split_random.json" 2>&1 | grep "^tune" | tail -4
rm -rf /tmp/runs
e2e_run 150 shipped_ra --bits 4,mixed26 --batches 48,56,64
e2e_run 90 split4_ra --bits 4,mixed26 --batches 48,56,64 --wide-down-split-stages 4
e2e_run 70 shipped_rb --bits 4,mixed26 --batches 48,56,64
e2e_run 70 split4_rb --bits 4,mixed26 --batches 48,56,64 --wide-down-split-stages 4
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_down_split_ab.json" | tail -14
