#!/usr/bin/env bash
# Session 62's end-to-end A/B of MoeTiles.gate_up_combine_appended (MoeTuning.gate_up_combine_appended):
# the apart gate/up launch's combine appended to its grid against the combine launch after it,
# synthetic Mixtral-8x7B, rounds a (the first run compiles both) and b where LIMIT leaves time.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (540)] [ARGS=e2e_decode.py flags] bash tools/device/s62_e2e.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-540}
left() { echo $((LIMIT - SECONDS)); }
rm -rf /tmp/runs
ARGS=${ARGS:-"--bits 4,mixed26 --batches 4,16,64"}
e2e_run 170 appended_ra $ARGS --gate-up-combine-appended
e2e_run 130 launch_ra $ARGS --no-gate-up-combine-appended
[[ $(left) -gt 180 ]] && e2e_run 80 appended_rb $ARGS --gate-up-combine-appended \
  && e2e_run 80 launch_rb $ARGS --no-gate-up-combine-appended
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_appended_s62.json" > /tmp/table.txt
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tail -16 /tmp/table.txt
