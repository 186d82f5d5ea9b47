#!/usr/bin/env bash
# Session 62: the combine launch of MoeTiles.gate_up_apart under the small launches' PDL policy (up to
# 64 rows) with its routing loads before the wait (B), against session 61's (A: the weight launches'
# policy, none past 16 rows; tools/device/patches/combine_weights_pdl.py in a copy). The B=64 profile
# (tools/device/s62_profile.sh) put the combine at 0.574 ms of a 13.75 ms step (18 us a layer).
# Synthetic Mixtral-8x7B end to end, $ARGS, rounds B A B A where LIMIT leaves time; then the GPU tests of
# the combine.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   [LIMIT=seconds (360)] [ARGS=e2e_decode.py flags] bash tools/device/s62_combine_pdl.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-360}
left() { echo $((LIMIT - SECONDS)); }
ARGS=${ARGS:-"--bits 4 --batches 16,64"}
rm -rf /tmp/runs /tmp/b && mkdir -p /tmp/b
tar --exclude=./benchmarks/results -cf - . | tar -xf - -C /tmp/b
(cd /tmp/b && python3 tools/device/patches/combine_weights_pdl.py) || exit 1
run_in() {  # run_in DIR NAME SECONDS
  (cd "$1" && timeout "$3" python3 benchmarks/e2e_decode.py --preset mixtral-8x7b --commit "$C+$2" \
    --out "/tmp/runs/$2.json" $ARGS > "/tmp/runs/$2.log" 2>&1 || tail -3 "/tmp/runs/$2.log")
}
mkdir -p /tmp/runs
run_in . pdl_ra 150
run_in /tmp/b weights_ra 110
[[ $(left) -gt 130 ]] && run_in . pdl_rb 65 && run_in /tmp/b weights_rb 65
python3 benchmarks/merge_runs.py /tmp/runs "${OUT:-/tmp}/e2e_combine_pdl_s62.json" > /tmp/table.txt
[[ $(left) -gt 40 ]] && timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/kernels/test_moe_combine.py -k "16-32-4" 2>&1 | tail -1
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tail -8 /tmp/table.txt
