#!/usr/bin/env bash
# Session 54, second call: benchmarks/host_only_cost.py for the planner's states at the in-place
# read price (PLANS, default benchmarks/results/frontier_u3_floor0_inplace_cpu.json) for WORKLOADS
# (default mix,german,python) at B = 1, 4, 16, then the warm-up coverage test on the GPU (host-only
# blocks now take the same launches and graphs, and the warm-up has no host-only rounds). Usage,
# with carry [".carry", "pagedweight", ".whl", "data/tokens"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/host_read_plans_s54.sh <commit> [PLANS] [WORKLOADS]
source .carry/on_device.sh || exit 1
C=$1
PLANS=${2:-benchmarks/results/frontier_u3_floor0_inplace_cpu.json}
for w in $(echo "${3:-mix,german,python}" | tr , ' '); do
  timeout 150 python3 benchmarks/host_only_cost.py --plan "$PLANS" --batches 1,4,16 \
    --workload "$w" --commit "$C" --out "${OUT:-/tmp}/host_only_cost_$w.json" 2>&1 | tail -14
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/dataplane/test_dp_warm_coverage.py -k cuda 2>&1 | tail -2
