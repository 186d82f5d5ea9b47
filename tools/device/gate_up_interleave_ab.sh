#!/usr/bin/env bash
# MoeTuning.gate_up_interleave_max_tokens (session 50; run in 51): the gate/up grid row tile major, so that a
# state giving whole experts one width mixes widths in the resident programs all through the launch.
# (1) the layer, Mixtral, round-robin: the shipped order, interleaved, the shipped order again, on
#     whole-expert mixing (even experts 6 bits, odd 2) at B=16 and 4, the in-expert mix and uniform 4;
# (2) end to end, 4-bit and mixed 2/6 (whole experts) at B=4/16, two interleaved rounds. ~5 minutes.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/gate_up_interleave_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 185 --commit "$C" \
  --tune-cases 16:views-6.6.6-2.2.2,4:views-6.6.6-2.2.2,16:mixed,16:4 \
  --candidates '[{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"gate_up_interleave_max_tokens":0}},{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"gate_up_interleave_max_tokens":64}},{"block_n":128,"num_warps":4,"use_asm":true,"tuning":{"gate_up_interleave_max_tokens":0}}]' \
  --out "${OUT:-/tmp}/moe_gate_up_interleave.json" 2>&1 | grep "^tune" | tail -4
for r in a b; do
  e2e_run 150 "expert_major_r$r" --bits 4,mixed26 --batches 4,16 --gate-up-interleave-max-tokens 0
  e2e_run 90 "interleaved_r$r" --bits 4,mixed26 --batches 4,16 --gate-up-interleave-max-tokens 64
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_gate_up_interleave.json" | tail -9
