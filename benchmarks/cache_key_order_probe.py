"""Probe: does a Triton kernel's cache key depend on what the process compiled
first? (dataplane/kernel_keys.py; CPU, a local sm_90 compile as
benchmarks/sass_loops.py makes.)

    .venv/bin/python benchmarks/cache_key_order_probe.py --out /tmp/probe.json

Four fresh processes print the MoE kernels' keys: ``fresh`` (nothing
compiled), ``after_compile`` (the one-token MoE down kernel compiled first),
``settled`` (dataplane.kernel_keys.settle_cache_keys first) and
``settled_after_compile`` (settled, then the same compile). order_dependent:
after_compile differs from fresh (Triton 3.6: yes, and the keys also depend
on the order in which they are first taken; 3.9: no). settled_stable:
settled_after_compile equals settled, what the dataplane relies on (every
process settles first, in the same order). To probe another Triton, put its
unpacked wheel first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.moe_tiles import MoeTiles  # noqa: E402

PROBED = ("kernels.moe_align._moe_prep_kernel", "kernels.moe_entry._moe_entry_kernel",
          "kernels.moe_gate_up._moe_gate_up_kernel", "kernels.moe_down._moe_down_kernel")
# The down launch of the one-token tile at Qwen1.5-MoE's B=1 shape (sass_loops.py's constexprs).
DOWN = {"BN": 64, "BM": 1, "BM_WIDE": 0, "USE_ASM": True, "PDL": True, "STAGES": 4, "STAGES_WIDE": 4,
        "HS_SUB": 1, "E_PAD": 16, "BALANCE": False,
        "DOWN_COSTS": MoeTiles().down_cost_word}
MODES = ("fresh", "after_compile", "settled", "settled_after_compile")


def child(mode: str) -> None:
    from dataplane.kernel_keys import jit_functions, settle_cache_keys

    if mode.startswith("settled"):
        settle_cache_keys()
    if mode.endswith("after_compile"):
        from benchmarks.sass_loops import compile_kernel

        compile_kernel("down", DOWN, num_warps=2, num_stages=DOWN["STAGES"])
    functions = jit_functions()
    print(json.dumps({name: functions[name].cache_key for name in PROBED}))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return {}
    import triton

    from benchmarks.provenance import cpu_header

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    keys = {}
    for mode in MODES:
        run = subprocess.run([sys.executable, __file__, "--child", mode], env=env, cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=600)
        keys[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    result = {"benchmark": "cache_key_order_probe", **cpu_header("benchmarks/cache_key_order_probe.py", argv,
                                                                   args.commit),
              "pythonpath": os.environ.get("PYTHONPATH", ""), "triton": triton.__version__, "keys": keys,
              "order_dependent": keys["after_compile"] != keys["fresh"],
              "settled_stable": keys["settled_after_compile"] == keys["settled"]}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"triton {result['triton']}: keys depend on compile order: {result['order_dependent']}; "
          f"settled up front, unchanged by a compile: {result['settled_stable']}")
    return result


if __name__ == "__main__":
    main()
