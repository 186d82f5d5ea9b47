#!/usr/bin/env bash
# Is whole-expert mixing dearer than the benchmark's own mixed state? bench_moe's "mixed" mixes
# inside each expert (gate 2 / up 6 bits, then the reverse), so neighbouring gate/up programs
# alternate light and heavy; e2e_decode's mixed26 (and the planner) give whole experts one width,
# and end to end mixed 2/6 ran 4.0 % under uniform 4-bit at B=16 on the H100 (session 50) where
# the layer had measured +1.5-2.0 % (session 49). Here, per launch at B=16/4 with round-robin and
# random routing: uniform 4, the in-expert mix, even experts 6 / odd 2, and even 2 / odd 6. The
# slots are already ordered costliest first (kernels/moe_align.py, slot_cost = the down blocks'
# field counts), so the last two should time alike; a difference would say the order does not hold.
# Usage, with carry [".carry", "pagedweight", ".whl"] after `make install proto` and
# tools/device/stage.sh:  bash tools/device/mixed_order_probe.sh <commit>
source .carry/on_device.sh || exit 1
for routing in roundrobin random; do
  timeout 200 python3 benchmarks/bench_moe.py --models mixtral --batches 16,4 --routing $routing \
    --bits 4,mixed,views-6.6.6-2.2.2,views-2.2.2-6.6.6 --stage-bits all --no-check --kernels-only \
    --budget 185 --commit "$1" --out "${OUT:-/tmp}/moe_mixed_order_$routing.json" 2>&1 | grep -v "^ *$" | tail -10
done
