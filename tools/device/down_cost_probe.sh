#!/usr/bin/env bash
# The balanced down launch's view costs on the lent card (session 49): on the H100 the uniform
# down launch at B=16 ran 2 / 4 / 6 bits in 68.3 / 100.1 / 135.8 us (8 : 11.7 : 15.9;
# moe_down_sharing_h100_s49.json), steeper than the table measured on the H200 (8 : 11 : 13).
# Run short in session 49 (moe_down_cost_h100_s49.json): that steeper table made the layer 3 % slower.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/down_cost_probe.sh <commit> [short]
# (1) Mixtral mixed 2/6 at B = 16 / 4 / 1 under the shipped costs (timed twice), the H100's
#     measured ratios (with and without zigzag), and session 47's steeper table;
# (2) with the winner, every view and mixed at B=16, each launch alone (the views' own costs).
source .carry/on_device.sh || exit 1
C='[{"block_n":128,"num_warps":4,"use_asm":true},
{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"down_group_cost":[8,10,12,16,20]}},
{"block_n":128,"num_warps":4,"use_asm":true}]'
# ${2:-full}: "short" (one call's last minutes) drops B=1, the zigzag and steeper tables and the 2/4/6 rows
if [ "${2:-full}" = short ]; then
  CASES=16:mixed,4:mixed; BITS=3,8,mixed; T=200; B=185
else
  C="${C%]}"',{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"down_group_cost":[8,10,12,16,20],"down_zigzag":true}},
{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"down_group_cost":[8,11,13,18,22]}}]'
  CASES=16:mixed,4:mixed,1:mixed; BITS=2,3,4,6,8,mixed; T=280; B=260
fi
timeout $T python3 benchmarks/bench_moe.py --models mixtral --autotune --candidates "$C" \
  --tune-cases $CASES --batches 16 --bits $BITS --stage-bits all --no-check \
  --kernels-only --budget $B --commit "$1" --out "${OUT:-/tmp}/moe_down_cost.json" 2>&1 | grep -v "^ *$" | tail -24
