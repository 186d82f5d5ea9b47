#!/usr/bin/env bash
# Session 53: benchmarks/host_read_probe.py (can a Triton kernel read pinned host memory in place,
# at what bandwidth, inside a CUDA graph: the premise of serving host-only blocks without leaving
# the graphs), then a second round of tools/device/h200_table.sh (issue 5's end-to-end table).
# ~4 minutes on a fresh machine. Usage, with carry [".carry", "pagedweight", ".whl"] after `make
# install proto` and tools/device/stage.sh:  bash tools/device/host_read_s53.sh <commit>
source .carry/on_device.sh > /dev/null || exit 1
timeout 120 python3 benchmarks/host_read_probe.py --commit "$1" --out "${OUT:-/tmp}/host_read_probe.json" 2>&1 | tail -6
bash tools/device/h200_table.sh "$1"
