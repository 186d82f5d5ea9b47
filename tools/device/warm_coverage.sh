#!/usr/bin/env bash
# A device call (after tools/device/stage.sh here): the warm-up's promise on
# the GPU. Runs tests/dataplane/test_dp_warm_coverage.py and prints the
# specialization data of any kernel variant compiled live after the warm-up
# (dataplane/kernel_compiles.py), also written to $OUT/warm_coverage_compiles.txt.
# About 150-210 s on a fresh machine (the warm-up's compiles).
source .carry/on_device.sh || exit 1
timeout "${1:-250}" python3 -m pytest -q -m gpu tests/dataplane/test_dp_warm_coverage.py -p no:cacheprovider \
  -o log_level=WARNING > /tmp/warm_coverage.log 2>&1
status=$?
grep -a "while serving" /tmp/warm_coverage.log | cut -c1-5000 > "${OUT:-/tmp}/warm_coverage_compiles.txt"
tail -3 /tmp/warm_coverage.log
cut -c1-3000 "${OUT:-/tmp}/warm_coverage_compiles.txt"
exit $status
