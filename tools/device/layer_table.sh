#!/usr/bin/env bash
# The issue-5 MoE layer table on the lent card, then the balanced down launch with and without
# zigzag at B=16 and 32, with the whole-expert mix (views-6.6.6-2.2.2: the planner's kind of state;
# the table's "mixed" mixes inside each expert) beside it (session 49's rows, still to run on an
# H200; about 8 minutes on a fresh machine).
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/layer_table.sh <commit>
source .carry/on_device.sh || exit 1
timeout 345 python3 benchmarks/bench_moe.py --models mixtral,qwen --bits 8,6,4,3,2,mixed \
  --batches 1,4,16,64 --stage-bits 4,mixed --kernels-only --no-check --budget 330 --commit "$1" \
  --out "${OUT:-/tmp}/moe_table.json" 2>&1 | grep -v "^ *$" | tail -70
timeout 150 python3 benchmarks/bench_moe.py --models mixtral --autotune --tune-cases 16:mixed,16:views-6.6.6-2.2.2 \
  --candidates '[{"block_n":128,"num_warps":4,"use_asm":true},{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"down_zigzag":true}},{"block_n":128,"num_warps":4,"use_asm":true}]' \
  --batches 16,32 --bits 2,4,6,mixed,views-6.6.6-2.2.2 --stage-bits all --no-check --kernels-only --budget 140 --commit "$1" \
  --out "${OUT:-/tmp}/moe_zigzag_b16.json" 2>&1 | grep -v "^ *$" | tail -34
