#!/usr/bin/env bash
# Session 56, call B (~7 min on a fresh machine): end to end, synthetic Mixtral-8x7B, B = 16 / 64,
# 4-bit and whole-expert mixed 2/6, two interleaved rounds of the shipped tiles against the
# tensor-core tiles on 256 rows (MoeTuning.tensor_core_rows; call A is tools/device/rows_probe.sh).
# Usage, as rows_probe.sh:  bash tools/device/rows_e2e_ab.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
e2e_run 170 shipped_ra --bits 4,mixed26 --batches 16,64
e2e_run 120 rows256_ra --bits 4,mixed26 --batches 16,64 --tensor-core-rows 256
e2e_run 100 shipped_rb --bits 4,mixed26 --batches 16,64
e2e_run 100 rows256_rb --bits 4,mixed26 --batches 16,64 --tensor-core-rows 256
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_rows_ab.json" | tail -10
nvidia-smi --query-gpu=name --format=csv,noheader
