#!/usr/bin/env bash
# Session 51 (prepared, not run): the 8-token tile at B=24/32 (MoeTuning.narrow_tile_max_mean 8
# instead of 4). B=32 takes the 16-token tile (a mean of 8 tokens per Mixtral expert), where the
# 2-bit layer ran at 50.5 % of the copy and the 4-bit at 73.9 % (moe_mixed_b32_probe_h100_s51.json);
# at B=16 the 8-token tile had been 12 % faster than the 16-token one. With it an expert over 8
# tokens takes a second pass of its program over the same weight rows, right after the first (from
# the L2 if they stay there). (1) The layer, Mixtral, random routing, round robin of the shipped
# tiles / narrow up to a mean of 8 / shipped: B=32 at 4 and 2 bits and the whole-expert mix, B=24
# at 4 bits; (2) end to end, 4-bit and whole-expert mixed 2/6 at B=24/32, two interleaved rounds.
# ~5 minutes. Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/narrow_b32_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
SHIPPED='{"block_n":128,"num_warps":4,"use_asm":true}'
NARROW='{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"narrow_tile_max_mean":8.0}}'
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 185 --commit "$C" \
  --routing random --tune-cases 32:4,32:2,32:views-6.6.6-2.2.2,24:4 \
  --candidates "[$SHIPPED,$NARROW,$SHIPPED]" \
  --out "${OUT:-/tmp}/moe_narrow_b32.json" 2>&1 | grep "^tune" | tail -3
for r in a b; do
  e2e_run 150 "shipped_r$r" --bits 4,mixed26 --batches 24,32
  e2e_run 90 "narrow8_r$r" --bits 4,mixed26 --batches 24,32 --narrow-tile-max-mean 8
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_narrow_b32.json" | tail -9
