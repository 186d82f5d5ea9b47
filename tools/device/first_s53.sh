#!/usr/bin/env bash
# Session 53's first call, chosen by the card that comes. On an H200: issue 5's end-to-end table at
# the shipped defaults (tools/device/h200_table.sh; no full H200 table since session 34). On an
# H100: tools/device/b64_wide_cost_probe.sh (prepared in session 52), then mixed 2/6 against
# uniform 4-bit at B=1 end to end, two interleaved rounds (the H200's one round put mixed at -3.4 %;
# B=1 was never A/B'd on the H100 since session 52's table). ~8 minutes on a fresh machine.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/first_s53.sh <commit>
C=$1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash tools/device/h200_table.sh "$C"
else
  bash tools/device/b64_wide_cost_probe.sh "$C"
  source .carry/on_device.sh > /dev/null || exit 1
  rm -rf /tmp/runs
  e2e_run 240 b1_ra --bits 4,mixed26 --batches 1
  e2e_run 100 b1_rb --bits mixed26,4 --batches 1
  python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_b1_mixed.json" | tail -8
fi
