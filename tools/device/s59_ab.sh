#!/usr/bin/env bash
# Engine A/B on one card: the tree as committed (A) against a copy with a patch from
# tools/device/patches run in the copy (B), Mixtral-8x7B layer times (bench_moe --tune-only, round-robin
# routing) at B:bits cases, rounds A B (A B A B from 360 s). B's candidates may add tuning (e.g. a register cap).
# Torch and Triton only. Usage: bash tools/device/s59_ab.sh <commit> <variant.py> <cases> <seconds> [B candidates]
set -uo pipefail
C=$1; PATCH=$2; CASES=$3; SECS=$4
BASE='[{"use_asm":true}]'
CAND_B=${5:-$BASE}
rm -rf /tmp/b && mkdir /tmp/b && cp -r benchmarks kernels tools /tmp/b/ && (cd /tmp/b && python3 "tools/device/patches/$PATCH")
ROUNDS=$(( SECS >= 360 ? 2 : 1 ))  # A B, or A B A B where the time allows
each=$((SECS / (2 * ROUNDS)))
ab_round() {  # ab_round DIR TAG CANDIDATES
  (cd "$1" && timeout "$each" python3 benchmarks/bench_moe.py --models mixtral --tune-only --budget $((each - 10)) \
    --commit "$C+$2" --tune-cases "$CASES" --candidates "$3" --out "${OUT:-/tmp}/ab_$2_$4.json" 2>&1 \
    | grep "^tune" | sed "s/^/$2 /")
}
for r in $(seq "$ROUNDS"); do ab_round . A "$BASE" "$r"; ab_round /tmp/b B "$CAND_B" "$r"; done
