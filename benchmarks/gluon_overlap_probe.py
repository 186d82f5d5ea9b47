"""Does an asynchronous wgmma, waited one step later, lift the MoE kernels'
per-step floor? A probe in Gluon (triton.experimental.gluon, Triton 3.6),
not a kernel of the engine.

The fused MoE loops (kernels/moe_block_matmul.py) run each 128 x 128 group
step as a serial chain: decode the A operand in registers, 16 wgmma, wait for
them, scale the group's product into the accumulator. Triton's tl.dot waits
for a register-A wgmma right after issuing it (benchmarks/NOTES.md, session
12). This probe runs the same shape of step — A decoded in registers from
32-bit words, B (16 tokens x 128) in shared memory, a fresh product per step
scaled into an fp32 accumulator — in two ways:

  sync:  wgmma, wait, scale the product (what Triton emits);
  async: issue step i's wgmma, wait until only it is in flight, scale step
         i - 1's product, so the tensor cores run while the next step
         decodes (UNROLL steps per loop iteration; --steps a multiple of it).

The words are loaded once into registers and each step's pairs are derived
from the previous step's (xor with the step index, then the rounds), so the
probe times the chain alone: no loads, no HBM. DECODE sets how many
dependent rounds of two integer ops each 32-bit pair takes (the real 2- and
4-bit decodes are ~1.2 and ~1.9 instructions per pair in the Triton 3.6
SASS: ~0.6 and ~1 round). Output: ns per step per program, with 2 programs
per multiprocessor as in the real launches.

    python3 benchmarks/gluon_overlap_probe.py --out benchmarks/results/gluon_overlap_h200.json

Measured (session 12, H200, benchmarks/results/gluon_overlap_h200.json):
the async form is not faster (0.80x / 0.93x / 1.05x / 0.88x at 0 / 1 / 2 / 4
rounds) and takes 255 registers against the sync form's 161. Getting it
built: an in-flight accumulator carried around the loop reaches the PTX as
phi copies and ptxas then serializes every wgmma (C7514 under `ptxas -v`),
hence the unrolled iteration with nothing in flight across the back edge.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.provenance import git_commit  # noqa: E402

# Rows, group width and tokens of a step, as in the MoE launches.
BN, BK, BM = gl.constexpr(128), gl.constexpr(128), gl.constexpr(16)
# Steps per loop iteration of the async form (a multiple of it is timed).
UNROLL = gl.constexpr(4)


@gluon.jit
def _decode(words, step, salt, DECODE: gl.constexpr):
    # The next step's pairs from this step's (registers of a product that may
    # still be in flight are only read): DECODE dependent rounds of two
    # integer ops per 32-bit pair (salt is a run-time value, so the chain is
    # not folded), a mask to two small fp16 halves. Returns the pairs and
    # their fp16 view [BN, BK]; the values do not matter, the chain does.
    words = words ^ step
    for _ in gl.static_range(DECODE):
        words = (words ^ salt) + salt
    words = words & 0x03FF03FF
    # The pair's halves as two fp16 values: a register move, no arithmetic.
    lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [words],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
    return words, gl.reshape(gl.join(lo, hi), [BN, BK])


@gluon.jit
def _probe_kernel(w_ptr, x_ptr, s_ptr, out_ptr, steps, salt, ASYNC: gl.constexpr, DECODE: gl.constexpr):
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    pair_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=1)
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)

    xk = gl.arange(0, BK, layout=gl.SliceLayout(1, blk))
    xm = gl.arange(0, BM, layout=gl.SliceLayout(0, blk))
    x_s = gl.allocate_shared_memory(gl.float16, [BK, BM], x_sl, gl.load(x_ptr + xk[:, None] * BM + xm[None, :]))
    fence_async_shared()

    rn = gl.arange(0, BN, layout=gl.SliceLayout(1, pair_l))
    rk = gl.arange(0, BK // 2, layout=gl.SliceLayout(0, pair_l))
    offs = rn[:, None] * (BK // 2) + rk[None, :]  # [BN, BK/2] int32 pairs, each thread its own A slots
    # Loaded once, each step's pairs derived from the previous step's: the
    # probe times the decode -> wgmma -> scale chain, not loads (per-thread
    # 4-byte loads here dominated the step: 2.6 us).
    words = gl.load(w_ptr + offs)
    scale = gl.load(s_ptr + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l)))  # [BN]
    acc = gl.zeros([BN, BM], gl.float32, acc_l)
    zero = gl.zeros([BN, BM], gl.float32, acc_l)
    if ASYNC:
        # UNROLL steps per iteration, none in flight across the loop's back
        # edge: an in-flight accumulator carried around the loop reaches the
        # PTX as phi copies, and ptxas then serializes every wgmma (C7514).
        # Per step: issue it, wait until only it is in flight, scale the
        # previous one in; the iteration's last product is waited for fully.
        for i in range(0, steps, UNROLL):
            words, a = _decode(words, i, salt, DECODE)
            tok = warpgroup_mma(gl.convert_layout(a, a_l, assert_trivial=True), x_s, zero, use_acc=False,
                                is_async=True)
            for j in gl.static_range(1, UNROLL):
                words, a = _decode(words, i + j, salt, DECODE)
                a = gl.convert_layout(a, a_l, assert_trivial=True)
                nxt = warpgroup_mma(a, x_s, zero, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(num_outstanding=1, deps=[tok])
                acc += part * scale[:, None]
                tok = nxt
            part = warpgroup_mma_wait(num_outstanding=0, deps=[tok])
            acc += part * scale[:, None]
    else:
        for i in range(steps):
            words, a = _decode(words, i, salt, DECODE)
            part = warpgroup_mma(gl.convert_layout(a, a_l, assert_trivial=True), x_s, zero, use_acc=False)
            acc += part * scale[:, None]
    on = gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
    gl.store(out_ptr + gl.program_id(0) * (BN * BM) + on[:, None] * BM + om[None, :], acc)


def run(steps: int, decode: int, asynchronous: bool, programs: int) -> float:
    """ns per step per program (median of timed launches)."""
    w = torch.randint(0, 2**31 - 1, (BN, BK // 2), dtype=torch.int32, device="cuda")
    x = (torch.randn(BK, BM, device="cuda") * 1e-2).to(torch.float16)
    s = torch.rand(BN, device="cuda")
    out = torch.empty(programs, BN, BM, device="cuda")
    launch = lambda: _probe_kernel[(programs,)](w, x, s, out, steps, 0x00050005, ASYNC=asynchronous,  # noqa: E731
                                                DECODE=decode, num_warps=4)
    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e6 / steps)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=2048)
    ap.add_argument("--decode", default="0,1,2,4")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    if args.steps <= 0 or args.steps % UNROLL.value:
        ap.error(f"--steps must be a positive multiple of {UNROLL.value}")
    programs = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for decode in map(int, args.decode.split(",")):
        sync_ns = run(args.steps, decode, False, programs)
        async_ns = run(args.steps, decode, True, programs)
        rows.append(dict(decode_rounds=decode, sync_ns_per_step=sync_ns, async_ns_per_step=async_ns,
                         speedup=sync_ns / async_ns))
        print(f"decode {decode}: sync {sync_ns:7.1f} ns/step, async {async_ns:7.1f} ns/step, "
              f"x{sync_ns / async_ns:.2f}", flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                triton=triton.__version__)
    args.out.write_text(json.dumps(dict(**meta, programs=programs, steps=args.steps, rows=rows), indent=1))


if __name__ == "__main__":
    main()
