#!/usr/bin/env bash
# The cost of mixing on the lent card: synthetic Mixtral-8x7B, uniform 4-bit against whole-expert
# mixed 2/6 at B = 1 / 16, three interleaved rounds (the first run compiles; ~5 minutes fresh).
# Session 56's one H200 round read mixed 2/6 at -3.2 / -4.0 % of 4-bit (issue 5 asks <= 2 %), the
# H100 -1.6 / -0.7 % (session 55): this tells whether the H200's excess is the card or the round.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/mixed_cost_rounds.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
for r in a b c; do
  e2e_run 150 "cost_r$r" --bits 4,mixed26 --batches 1,16
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_mixed_cost_rounds.json" | tail -6
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
