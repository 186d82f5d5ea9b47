#!/usr/bin/env bash
# Session 56's question: does the 16-token tile's activation tile ([128 K x 16] fp16, 4 KiB a step,
# read from the L2 by every program of an expert) bound the narrow views? At 2 bits a gate/up step
# reads 4.6 KiB of weights and 4 KiB of activations; the 8-token tile (B <= 16) reads 2 KiB. Nsight
# Compute counters of Mixtral's gate/up and down launches, round robin, 2 and 4 bits, at B=16 (the
# 8-token tile) and B=64 without the wide tile (the 16-token tile, as the split runs round robin):
# L2 throughput, L2 -> SM bytes against DRAM bytes, stalls. ~40 s a case.
# Usage: bash tools/device/l2_activation_probe.sh <commit>   (after source .carry/on_device.sh)
C=$1
mkdir -p /tmp/ncu
for case in "16 2" "64 2" "16 4" "64 4"; do
  set -- $case
  timeout 90 bash benchmarks/ncu_moe.sh "/tmp/ncu/b$1_bits$2.csv" --batch "$1" --bits "$2" --wide 0 \
    > /dev/null 2> "/tmp/ncu/b$1_bits$2.err" || tail -3 "/tmp/ncu/b$1_bits$2.err"
done
python3 benchmarks/ncu_summary.py /tmp/ncu/*.csv --json "${OUT:-/tmp}/moe_ncu_l2_activation.json" --commit "$C" \
  | grep -E "^metric|Duration|DRAM Throughput|L2 Cache Throughput|dram__bytes|lts__t_sectors_src|xbar2l1tex|Issued Warp|long_score|barrier|mio|lg_thr|^wait"
