#!/usr/bin/env bash
# Session 62: where a 4-bit decode step's time goes at B = 64 (76 % of the H100's copy roofline end to
# end against 93 % at B = 16; the MoE layer alone at 74 % / 87 %): synthetic Mixtral-8x7B, the timed
# rows at B = 16 / 64, then torch.profiler per step (benchmarks/decode_profile.py) at both, each step's
# critical path by kernel.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/s62_profile.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
rm -rf /tmp/runs
e2e_run 330 prof --bits 4 --batches 16,64 --profile-batches 16,64
cp /tmp/runs/prof.json "${OUT:-/tmp}/e2e_profile_s62.json" 2>/dev/null
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
python3 - <<'PY'
import json
d = json.load(open("/tmp/runs/prof.json"))
for r in d["rows"]:
    print(f"B={r['batch']} tok/s {r['tok_per_s']:.1f} engine {r['engine_step_ms']:.2f} ms roofline {r['roofline_ms']:.2f} ms")
for p in d["profiles"]:
    cp = p["critical_path"]
    print(f"B={p['batch']} busy {cp['busy_ms_per_step']:.2f} idle {cp['idle_ms_per_step']:.2f} ms/step; critical path:")
    for k in cp["kernels"][:12]:
        print(f"  {k['ms_per_step']:7.3f}  {k['name'][:70]}")
PY
