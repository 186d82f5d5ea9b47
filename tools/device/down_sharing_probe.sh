#!/usr/bin/env bash
# The balanced down launch's sharing on Mixtral B=16 (8-token tile), prepared in session 48, run in
# session 49 on an H100 (benchmarks/results/moe_down_sharing_h100_s49.json,
# moe_straddle_rr7_h100_s49.json). Usage, with carry [".carry", "pagedweight", ".whl"]
# after `make install proto` and tools/device/stage.sh:
#   bash tools/device/down_sharing_probe.sh <commit>
# (1) mixed 2/6 under the shipped sharing (first and last) and the zigzag order (MoeTuning.down_zigzag)
#     at B = 16 / 4; then per view and per launch at B=16: uniform 6 / 4 / 2, mixed 2/6, down alone mixed;
# (2) uniform 4-bit routed round-robin over 7 of 8 experts: the launch keeps 8 programs a row tile,
#     so 6 of the 8 programs start a second expert's range with no mixing at all (against 7/8 of
#     the 8-expert down launch, the straddle's own cost).
source .carry/on_device.sh || exit 1
C='[{"block_n":128,"num_warps":4,"use_asm":true},
{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"down_zigzag":true}},
{"block_n":128,"num_warps":4,"use_asm":true}]'
timeout 330 python3 benchmarks/bench_moe.py --models mixtral --autotune --candidates "$C" --tune-cases 16:mixed,4:mixed \
  --batches 16 --bits 6,4,2,mixed,views-4.4.2-4.4.6 --stage-bits all --no-check \
  --kernels-only --budget 300 --commit "$1" --out "${OUT:-/tmp}/moe_down_sharing_b16.json" 2>&1 | grep -v "^ *$" | tail -22
timeout 110 python3 benchmarks/bench_moe.py --models mixtral --batches 16 --routing roundrobin:7 \
  --bits 4,2 --stage-bits all --no-check \
  --kernels-only --budget 90 --commit "$1" --out "${OUT:-/tmp}/moe_straddle_rr7.json" 2>&1 | grep -v "^ *$" | tail -6
