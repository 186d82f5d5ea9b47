#!/usr/bin/env bash
# Session 53: host-only expert blocks served at their master view (WeightStore.host_only_served), on
# the GPU. The weight store's CUDA tests (tests/weights/test_store.py -k cuda: a fetch's freed pages
# reused in stream order), then benchmarks/host_only_cost.py on the default model for the floor-0
# frontier's planner states at the uniform-3 budget (PLANS, a frontier JSON, default
# benchmarks/results/frontier_floor0_cpu.json) for WORKLOADS (default mix,german). ~5 minutes on a
# fresh machine. Usage, with carry [".carry", "pagedweight", ".whl", "data/tokens"] after `make
# install proto` and tools/device/stage.sh:  bash tools/device/host_only_s53.sh <commit> [PLANS] [WORKLOADS]
source .carry/on_device.sh || exit 1
C=$1
PLANS=${2:-benchmarks/results/frontier_floor0_cpu.json}
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/weights/test_store.py -k cuda 2>&1 | tail -2
for w in $(echo "${3:-mix,german}" | tr , ' '); do
  timeout 240 python3 benchmarks/host_only_cost.py --plan "$PLANS" \
    --workload "$w" --commit "$C" --out "${OUT:-/tmp}/host_only_cost_$w.json" 2>&1 | tail -7
done
