#!/usr/bin/env bash
# Session 55's one call (fresh machine, <= 560 s): the issue-5 end-to-end cells at the shipped
# defaults (synthetic Mixtral-8x7B, 8 / 4-bit and whole-expert mixed 2/6 at B = 1 / 16 / 64; the
# first run compiles), then B=64 4-bit and mixed 2/6 with gate/up as two launches
# (--wide-gate-up-split-stages 4) and shipped again, paired on the warm machine.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/s55_call.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
e2e_run 320 table --bits 8,4,mixed26 --batches 1,16,64
e2e_run 120 split4_ra --bits 4,mixed26 --batches 64 --wide-gate-up-split-stages 4
e2e_run 90 shipped64_ra --bits 4,mixed26 --batches 64
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_s55.json" | tail -20
