#!/bin/bash
# Nsight Compute counters of the two MoE weight launches, as the session-9
# counter runs took them (benchmarks/results/moe_ncu_*_h200.json):
#   benchmarks/ncu_moe.sh OUT.csv [moe_ncu_probe.py flags, e.g. --batch 64 --bits 4 --wide 32]
# Then: python benchmarks/ncu_summary.py A.csv B.csv [--json table.json --commit C]
# The 4th call's launches are read (launch-skip 6: three calls of two launches).
set -euo pipefail
out=$1; shift
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
# Where more resident programs could lose: L1 hits (the carveout shrinks L1),
# shared-memory bank conflicts, L2 hits and DRAM bytes.
metrics="$metrics,l1tex__t_sector_hit_rate.pct,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
metrics="$metrics,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum"
# What the multiprocessors read from the L2 (weights and the activation tiles) against what the L2 reads
# from DRAM (the weights): their ratio is the activations' share of the L2's traffic.
metrics="$metrics,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum"
for stall in long_scoreboard wait barrier short_scoreboard math_pipe_throttle mio_throttle lg_throttle \
             not_selected selected dispatch_stall no_instruction branch_resolving membar sleeping drain \
             imc_miss tex_throttle; do
  metrics="$metrics,smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio"
done
"$NCU" --clock-control none -k regex:'_moe_(gate_up|down)' --launch-skip 6 --launch-count 2 \
  --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
  --metrics "$metrics" --csv --page details \
  python "$(dirname "$0")/moe_ncu_probe.py" "$@" > "$out"
