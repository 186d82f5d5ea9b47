#!/usr/bin/env bash
# Session 66: the combine launch storing one h plane (the expert's down view's; the tree, A) against
# all three (tools/device/patches/all_planes.py in a copy, B). The layer (tools/device/s59_ab.sh,
# Mixtral, round robin, A B A B), then end to end, 4-bit and mixed 2/6 at B = 16 / 64, one round
# each, where LIMIT leaves time. Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto`
# and tools/device/stage.sh:
#   [LIMIT=seconds (560)] [LAYER_SECS=360] [E2E_ARGS=...] bash tools/device/s66_planes.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
LIMIT=${LIMIT:-560}
O=${OUT:-/tmp}
bash tools/device/s59_ab.sh "$C" all_planes.py 16:4,32:4,64:4,64:2,64:8 "${LAYER_SECS:-360}" | tee /tmp/ab.txt
rm -rf /tmp/b2 /tmp/runs && mkdir /tmp/b2 && tar --exclude=./.git -cf - . | tar -xf - -C /tmp/b2 \
  && (cd /tmp/b2 && python3 tools/device/patches/all_planes.py) || exit 1
left=$((LIMIT - SECONDS))
if [[ $left -gt 120 ]]; then
  ARGS=${E2E_ARGS:-"--bits 4,mixed26 --batches 16,64"}
  # shellcheck disable=SC2086  # ARGS is a list of flags
  e2e_run $(( (left - 20) / 2 )) one_plane $ARGS
  # shellcheck disable=SC2086
  (cd /tmp/b2 && e2e_run $(( LIMIT - SECONDS - 20 )) all_planes $ARGS)
  python3 benchmarks/merge_runs.py /tmp/runs "$O/e2e_planes_ab.json" > /tmp/table.txt
fi
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cut -c1-160 /tmp/ab.txt; tail -6 /tmp/table.txt 2>/dev/null
