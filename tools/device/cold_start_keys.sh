#!/usr/bin/env bash
# A device call (after tools/device/stage.sh here; carry [".carry", "pagedweight", ".whl"]):
# three starts of synthetic Mixtral-8x7B on empty Triton caches (benchmarks/cold_start.py):
# cold; precompiled in processes with every cache key logged, its dataplane's
# against its workers' (benchmarks/cache_key_log.py: which parts of the MoE
# variants' keys differ); precompiled in threads of the dataplane's process.
# Usage: bash tools/device/cold_start_keys.sh <commit>. About 500-600 s on a
# fresh H100 (session 45's starts: 213 s cold, 197 s precompiled; threads not
# yet run); the JSON is written after each start, so a cut call keeps the first two.
source .carry/on_device.sh || exit 1
timeout 560 python3 benchmarks/cold_start.py --preset mixtral-8x7b --commit "$1" --key-log /tmp/keylog \
  --starts cold,precompiled,threads \
  --out "${OUT:-/tmp}/cold_start_keys.json" --timeout 330 2>&1 | tail -6
python3 - "${OUT:-/tmp}/cold_start_keys.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])).get("key_diagnosis", {})
print({k: (v if not isinstance(v, list) else len(v)) for k, v in d.items()})
for row in d.get("differ", [])[:6]:
    print(json.dumps(row)[:1500])
PY
