#!/usr/bin/env bash
# Session 64's follow-up: end to end (synthetic Mixtral-8x7B, 4-bit and whole-expert mixed 2/6) with
# the given e2e_decode.py flags against the shipped defaults, rounds new old new old where LIMIT
# leaves time. Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and
# tools/device/stage.sh:  [LIMIT=seconds (540)] bash tools/device/s64_e2e.sh <commit> "<flags>" <batches>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
rm -rf /tmp/runs
for r in a b; do
  # shellcheck disable=SC2086
  [[ $(left) -gt 120 ]] && e2e_run $(( ($(left) - 10) / 2 )) "new_r$r" --bits 4,mixed26 --batches "$3" $2
  [[ $(left) -gt 60 ]] && e2e_run $(( $(left) - 10 )) "old_r$r" --bits 4,mixed26 --batches "$3"
done
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_s64.json" 2>&1 | tail -10
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
