#!/usr/bin/env bash
# Session 52: Mixtral B=64 (mean 16 tokens per expert) takes the 16-token tile with the 32-token
# wide tile compiled in; its 4-bit gate/up ran 270.1 us against 208.6 at B=16 on the same bytes
# (moe_table_h100_s52.json). Here the layer, random routing, round robin of the shipped tiles /
# every expert on one 32-token tile (no wide tile, so the balanced down launch) / the same with the
# plain down split / shipped, at B=64 (8, 4, 2 bits, whole-expert mix) and B=48. ~3 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/b64_tile_probe.sh <commit>
source .carry/on_device.sh || exit 1
SHIPPED='{"block_n":128,"num_warps":4,"use_asm":true}'
T32='{"block_n":128,"num_warps":4,"use_asm":true,"block_m":32}'
T32PLAIN='{"block_n":128,"num_warps":4,"use_asm":true,"block_m":32,"balance_down":false}'
timeout 230 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 215 --commit "$1" \
  --routing random --tune-cases 64:4,64:2,64:8,64:views-6.6.6-2.2.2,48:4 \
  --candidates "[$SHIPPED,$T32,$T32PLAIN,$SHIPPED]" \
  --out "${OUT:-/tmp}/moe_b64_tile.json" 2>&1 | grep "^tune" | tail -4
