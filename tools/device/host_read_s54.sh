#!/usr/bin/env bash
# Session 54: host-only expert blocks read in place by the MoE kernels from pinned host memory
# (the page table names the master's host pages). GPU tests of the store, the fused layer and the
# decode graphs with host-only blocks, then benchmarks/host_only_cost.py for a frontier's planner
# states (PLANS, default the old-price hull plans) for WORKLOADS (default mix,german). ~6 minutes
# on a fresh machine. Usage, with carry [".carry", "pagedweight", ".whl", "data/tokens"] after
# `make install proto` and tools/device/stage.sh:  bash tools/device/host_read_s54.sh <commit> [PLANS] [WORKLOADS]
source .carry/on_device.sh || exit 1
C=$1
PLANS=${2:-benchmarks/results/frontier_u3_floor0_hull_oldprice_cpu.json}
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/weights/test_store.py \
  tests/weights/test_paged_experts_fused.py tests/dataplane/test_dp_decode_graphs.py -k "cuda or gpu or fused" 2>&1 | tail -4
for w in $(echo "${3:-mix,german}" | tr , ' '); do
  timeout 300 python3 benchmarks/host_only_cost.py --plan "$PLANS" \
    --workload "$w" --commit "$C" --out "${OUT:-/tmp}/host_only_cost_$w.json" 2>&1 | tail -10
done
