#!/usr/bin/env bash
# A device call (after tools/device/stage.sh here; carry [".carry", "pagedweight", ".whl"]):
# three starts of synthetic Mixtral-8x7B (benchmarks/cold_start.py): cold on an
# empty Triton cache (writes the manifest), precompiled from that manifest in
# threads of the dataplane on another empty cache, warm (a restart on the second
# cache). Usage: bash tools/device/cold_start.sh <commit>. About 300 s of
# starts on a fresh H100 (80ce4ea: 198.0 s cold, 43.2 s precompiled in threads),
# plus the machine's start; the JSON is written after each start.
source .carry/on_device.sh || exit 1
timeout 560 python3 benchmarks/cold_start.py --preset mixtral-8x7b --commit "$1" --starts cold,precompiled,warm \
  --out "${OUT:-/tmp}/cold_start.json" --timeout 330 2>&1 | tail -6
