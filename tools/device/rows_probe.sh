#!/usr/bin/env bash
# Session 56, call A (fresh machine, ~7 min): the tensor-core tiles on 256 weight rows and 8 warps
# (MoeTuning.tensor_core_rows), so that each activation tile serves twice the rows. First its GPU
# tests (eager and graph replay against the reference), then Nsight Compute counters of gate/up and
# down at B=64, 2 bits, round robin, no wide tile, 128 against 256 rows (L2 throughput, L2 -> SM bytes
# against DRAM bytes), then the layer, Mixtral, random routing, shipped / 256 rows / shipped.
# The end-to-end A/B that was to follow (call B) was not run: the layer was slower.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make proto` and tools/device/stage.sh:
#   bash tools/device/rows_probe.sh <commit>
source .carry/on_device.sh || exit 1
C=$1
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_row_tiles.py 2>&1 | tail -2
mkdir -p /tmp/ncu
for rows in 128 256; do
  timeout 80 bash benchmarks/ncu_moe.sh "/tmp/ncu/b64_bits2_rows$rows.csv" --batch 64 --bits 2 --wide 0 \
    --tuning "{\"tensor_core_rows\": $rows}" > /dev/null 2> /tmp/ncu/err_$rows.txt || tail -3 /tmp/ncu/err_$rows.txt
done
python3 benchmarks/ncu_summary.py /tmp/ncu/*.csv --json "${OUT:-/tmp}/moe_ncu_rows.json" --commit "$C" \
  | grep -E "^metric|Duration|Registers|Achieved|DRAM Throughput|L2 Cache Throughput|dram__bytes|lts__t_sectors_src|xbar2l1tex|Issued Warp|long_score|barrier|^wait"
CANDS='[{"use_asm":true},{"use_asm":true,"tuning":{"tensor_core_rows":256}},{"use_asm":true}]'
timeout 200 python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget 190 --commit "$C" \
  --routing random --tune-cases 16:4,16:2,32:4,32:2,64:4,64:2,64:8,64:mixed --candidates "$CANDS" \
  --out "${OUT:-/tmp}/moe_rows_random.json" 2>&1 | grep "^tune" | tail -3
nvidia-smi --query-gpu=name --format=csv,noheader
