"""Issue rates of the one-token tile's arithmetic on this GPU (probe).

    python3 benchmarks/issue_rate_probe.py --out results.json [--commit SHA]

The one-token MoE loop (kernels/moe_cuda_core.py) spends 64 dp2a (SASS IDP)
per row and group at every view, next to 40-88 LOP3 and ~20 IMAD. Whether
the 2-bit loop (196 instructions, 64 IDP) can run faster than it does
depends on how many IDP a multiprocessor issues per clock. This probe times
EIGHT independent chains per thread of one instruction kind (no memory
traffic), so that the rate, not the latency, bounds it, on a full GPU of
programs at 4 warps:

  dp2a  (dp2a.lo.s32.u32, IDP), imad (mad.lo.s32, IMAD), lop3 (lop3.b32),
  ffma  (fma.rn.f32), hfma2 (fma.rn.f16x2), and pairs of the integer kinds
  alternating in one chain (which of them share a pipe).

Output: warp instructions per microsecond per multiprocessor, and each
kind's rate relative to FFMA (4 warp instructions a clock per
multiprocessor on Hopper: 128 FP32 lanes). The SM clock under load is not
read (torch.cuda.clock_rate reported an idle 345 MHz on the H200).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import git_commit  # noqa: E402

CHAINS = 8  # independent chains per thread
UNROLL = 16  # instructions per chain per loop iteration
# Per instruction kind: (PTX of one step "d = op(d, a, b)" over 32-bit registers, register type).
KINDS = {
    "dp2a": "dp2a.lo.s32.u32 $0, $1, $2, $0;",
    "imad": "mad.lo.s32 $0, $1, $2, $0;",
    "lop3": "lop3.b32 $0, $1, $2, $0, 0x96;",
    "ffma": "fma.rn.f32 d, a, b, d;",
    "hfma2": "fma.rn.f16x2 $0, $1, $2, $0;",
    # Two kinds alternating in each chain: at their combined rate if they
    # issue to different pipes, at the slower one's if they share one.
    "dp2a+lop3": "dp2a.lo.s32.u32 $0, $1, $2, $0; lop3.b32 $0, $1, $2, $0, 0x96;",
    "dp2a+imad": "dp2a.lo.s32.u32 $0, $1, $2, $0; mad.lo.s32 $0, $1, $2, $0;",
    "imad+lop3": "mad.lo.s32 $0, $1, $2, $0; lop3.b32 $0, $1, $2, $0, 0x96;",
}
# Instructions per step of each kind's PTX (the pairs are two).
STEP_INSTRUCTIONS = {name: step.count(";") for name, step in KINDS.items()}


def chain_asm(ptx_step: str) -> str:
    """PTX of UNROLL dependent steps on $0 (tied to input $3)."""
    body = " ".join([ptx_step] * UNROLL)
    if " d, a, b, d;" in ptx_step:  # fp32: through typed registers (the moves are renames)
        body = ".reg .f32 d, a, b; mov.b32 d, $3; mov.b32 a, $1; mov.b32 b, $2; " + body + " mov.b32 $0, d;"
    return "{ " + body + " }"


@triton.jit
def _chain(d, a, b, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r,r,0", [a, b, d], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _chains_kernel(out_ptr, seed, iters, ASM: tl.constexpr):
    t = tl.arange(0, 128) + tl.program_id(0) * 128 + seed
    a = t * 3 + 1
    b = t * 5 + 7
    d0, d1, d2, d3 = t, t + 1, t + 2, t + 3
    d4, d5, d6, d7 = t + 4, t + 5, t + 6, t + 7
    for _ in range(iters):
        d0 = _chain(d0, a, b, ASM)
        d1 = _chain(d1, a, b, ASM)
        d2 = _chain(d2, a, b, ASM)
        d3 = _chain(d3, a, b, ASM)
        d4 = _chain(d4, a, b, ASM)
        d5 = _chain(d5, a, b, ASM)
        d6 = _chain(d6, a, b, ASM)
        d7 = _chain(d7, a, b, ASM)
    tl.store(out_ptr + tl.program_id(0) * 128 + tl.arange(0, 128), d0 ^ d1 ^ d2 ^ d3 ^ d4 ^ d5 ^ d6 ^ d7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit")
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--programs-per-sm", default="2,4")
    args = ap.parse_args()
    started = time.time()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    rows = []
    for per_sm in [int(p) for p in args.programs_per_sm.split(",")]:
        programs = sms * per_sm
        out = torch.empty(programs * 128, dtype=torch.int32, device="cuda")
        for name, step in KINDS.items():
            asm = chain_asm(step)

            def launch(asm=asm):
                _chains_kernel[(programs,)](out, 1, args.iters, ASM=asm, num_warps=4)

            ms = triton.testing.do_bench(launch, warmup=20, rep=200, return_mode="median")
            warp_instr = programs * 4 * args.iters * CHAINS * UNROLL * STEP_INSTRUCTIONS[name]
            per_sm_per_us = warp_instr / sms / (ms * 1e3)
            row = dict(kind=name, programs_per_sm=per_sm, time_ms=ms, warp_instructions=warp_instr,
                       warp_instr_per_sm_per_us=per_sm_per_us)
            rows.append(row)
            print(f"{per_sm} progs/SM {name:6s} {ms:8.3f} ms {per_sm_per_us:8.1f} warp-instr/SM/us", flush=True)
    for r in rows:
        ffma = next(x for x in rows if x["kind"] == "ffma" and x["programs_per_sm"] == r["programs_per_sm"])
        r["rate_vs_ffma"] = r["warp_instr_per_sm_per_us"] / ffma["warp_instr_per_sm_per_us"]
    result = {
        "benchmark": "issue rate of dp2a / imad / lop3 / ffma / hfma2 chains (no memory), 4 warps a program",
        "command": " ".join(["benchmarks/issue_rate_probe.py", *sys.argv[1:]]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(args.commit),
        "device": torch.cuda.get_device_name(0), "sms": sms,
        "torch": torch.__version__, "triton": triton.__version__,
        "chains_per_thread": CHAINS, "unroll": UNROLL, "rows": rows, "wall_s": time.time() - started,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'kind':6s} " + " ".join(f"{p}/SM vs ffma" for p in args.programs_per_sm.split(",")))
    for name in KINDS:
        vals = [r["rate_vs_ffma"] for r in rows if r["kind"] == name]
        print(f"{name:6s} " + " ".join(f"{v:12.3f}" for v in vals))


if __name__ == "__main__":
    main()
