#!/usr/bin/env bash
# Stages what a call on the lent GPU machine needs beside the working tree
# (benchmarks/NOTES.md, session 44). Run here, after `make install proto`:
#   * .whl/: the wheels the device image lacks (pydantic and its needs),
#     cp312 manylinux, versions from constraints.txt;
#   * .carry/site/grpc_health: the health service (not on the image);
#   * .carry/on_device.sh: sourced first by every call there (below).
# Then pass carry [".carry", "pagedweight", ".whl"] to the device tool and
# start the command with `source .carry/on_device.sh`. Both folders are
# git-ignored.
set -euo pipefail
cd "$(dirname "$0")/../.."
pin() { grep -i "^$1==" constraints.txt; }
mkdir -p .whl .carry/site
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(pin pydantic)" "$(pin pydantic_core)" "$(pin pydantic-settings)" "$(pin annotated-types)" \
  "$(pin python-dotenv)" typing-inspection typing-extensions
rm -rf .carry/site/grpc_health
cp -r .venv/lib/python3.*/site-packages/grpc_health .carry/site/
cp tools/device/on_device.sh .carry/on_device.sh
echo "staged: $(ls .whl | wc -l) wheels, grpc_health, .carry/on_device.sh"
