#!/usr/bin/env bash
# Session 51: end to end, whole-expert mixed 2/6 runs 3.0 % under uniform 4-bit at B=32 on the H100
# (e2e_defaults_ab_h100_s51.json) against 1.1 % at B=16. B=32 takes the 16-token tile with no wide
# tile and the balanced down launch; B=16 the 8-token tile. Here the layer per launch at B=32 and 16,
# random routing: uniform 2 / 4 / 6, whole-expert mixing (even experts 6, odd 2) and the in-expert
# mix, at the shipped defaults (gate/up row tile major up to 32 tokens). ~3 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/mixed_b32_probe.sh <commit>
source .carry/on_device.sh || exit 1
timeout 170 python3 benchmarks/bench_moe.py --models mixtral --batches 32,16 --routing random \
  --bits 4,views-6.6.6-2.2.2,2,6,mixed --stage-bits all --no-check --kernels-only \
  --budget 150 --commit "$1" --out "${OUT:-/tmp}/moe_mixed_b32_probe.json" 2>&1 | grep -v "^ *$" | tail -14
