"""Instruction counts of the fused MoE kernels' inner loops, from an sm_90
compile on this machine (no GPU needed: Triton's wheel carries ptxas and
cuobjdump).

The counts depend on the Triton version. The H200 image runs Triton 3.6, and
session 10 found a kernel that compiled well with the local 3.9 and badly with
3.6 (benchmarks/NOTES.md). To see what the device will run, compile with the
3.6 wheel kept in /opt/pypi:

    python -m pip install --no-deps --target /tmp/t36 \\
        /opt/pypi/files/triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
    PYTHONPATH=/tmp/t36:. .venv/bin/python benchmarks/sass_loops.py down --balance

Prints, per inner loop (a backward branch around tensor-core products, or
FFMA for the CUDA-core tile, --block-m 1; one per view the launch is
specialised for), its instructions and the counts of
the opcodes that mattered so far, then the kernel's registers and stack.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import moe_down, moe_gate_up, moe_gate_up_down  # noqa: E402
from kernels.moe_tile_choice import default_stages  # noqa: E402
from kernels.moe_tiles import CUDA_CORE_TOKEN_TILE, MoeTiles  # noqa: E402
from kernels.moe_tuning import MoeTuning  # noqa: E402
from kernels.moe_workspace import down_plan_width  # noqa: E402

KERNELS = {"gate_up": moe_gate_up._moe_gate_up_kernel, "down": moe_down._moe_down_kernel,
           "gate_up_down": moe_gate_up_down._moe_gate_up_down_kernel}
FP16_POINTERS = {"xp_ptr", "h_ptr"}  # the activation planes
FP32_POINTERS = {"xsum_ptr", "gu_ptr", "hsum_ptr", "tw_ptr", "out_ptr", "xq_scale_ptr", "hq_scale_ptr"}
# Integer arguments the launches pass as multiples of 16 (Triton specialises
# those as divisible by 16; the counts differ without it).
DIVISIBLE_INTS = {"H", "F", "pt_block_stride", "pt_field_stride", "q_x", "q_h"}
COUNTED = ("HGMMA", "HMMA", "IDP", "FFMA", "HADD2", "LOP3", "IADD3", "IMAD", "SHF", "SHFL", "PRMT", "IMAD.U32", "R2UR",
           "LDS", "LDGSTS", "LDG", "BAR.SYNC", "STL", "LDL")
TENSOR_CORE = ("HGMMA", "HMMA")
SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH_TARGET = re.compile(r"BRA (?:`\()?[^0-9]*?(0x[0-9a-f]+)")
RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def opcode(text: str) -> str:
    """The opcode of one SASS instruction's text, its guard predicate (@P0, @!UPT) removed."""
    return PREDICATE.sub("", text).split()[0]


@dataclass(frozen=True)
class Loop:
    start: int
    instructions: int
    counts: dict


def compile_kernel(name: str, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None = None,
                   pointer_types: dict | None = None):
    return compile_jit(KERNELS[name], constexprs, num_warps, num_stages, maxnreg, pointer_types)


def compile_jit(kernel, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None = None,
                pointer_types: dict | None = None):
    """An sm_90 compile of any kernel with the weight launches' argument
    conventions (pointer types by name, DIVISIBLE_INTS divisible by 16);
    pointer_types: argument name -> Triton type ("*fp16") where it differs."""
    constexprs = {k: v for k, v in constexprs.items() if k in kernel.arg_names}  # each kernel's own
    signature, attrs = {}, {}
    # The activation planes: int16 for the CUDA-core tile (MoeTiles.activation_dtype).
    planes = "*i16" if constexprs["BM"] == CUDA_CORE_TOKEN_TILE else "*fp16"
    for i, arg in enumerate(kernel.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            signature[arg] = (pointer_types or {}).get(arg) or (
                planes if arg in FP16_POINTERS else "*fp32" if arg in FP32_POINTERS else "*i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[arg] = "i32"
            if arg in DIVISIBLE_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages,
                                   **({"maxnreg": maxnreg} if maxnreg else {})})


def cuobjdump(*args: str) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return subprocess.run([str(tool), *args], capture_output=True, text=True, check=True).stdout


def cubin_sass(cubin_bytes: bytes) -> tuple[str, int, int]:
    """(SASS text, registers, stack bytes) of a compiled cubin (through a
    private temporary file: runs in parallel must not share one)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(cubin_bytes)
        sass = cuobjdump("-sass", str(cubin))
        regs, stack, _ = map(int, RESOURCES.search(cuobjdump("-res-usage", str(cubin))).groups())
    return sass, regs, stack


def inner_loops(sass: str, products: tuple[str, ...] = TENSOR_CORE, counted: tuple[str, ...] = COUNTED) -> list[Loop]:
    """Innermost backward-branch loops that hold products (opcodes named in
    products), each with the counts of the opcodes named in counted."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in map(SASS_LINE.match, sass.splitlines()) if m]
    mma = [addr for addr, text in code if any(op in text for op in products)]
    loops = set()
    for addr, text in code:
        target = BRANCH_TARGET.search(text)
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            if any(lo <= a <= addr for a in mma):
                loops.add((lo, addr))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    out = []
    for lo, hi in sorted(inner):
        body = [text for addr, text in code if lo <= addr <= hi]
        ops = collections.Counter(opcode(t) for t in body)
        counts = {c: sum(n for op, n in ops.items() if op == c or op.startswith(c + ".")) for c in counted}
        out.append(Loop(lo, len(body), counts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", choices=sorted(KERNELS))
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--block-m", type=int, default=16)
    ap.add_argument("--block-m-wide", type=int, default=0)
    ap.add_argument("--balance", action="store_true", help="down: the cost-shared split (MoeTiles.balance_down)")
    ap.add_argument("--zigzag", action="store_true", help="down: MoeTiles.down_zigzag (with --balance)")
    ap.add_argument("--experts", type=int, default=8, help="down: sets the plan width")
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--num-stages", type=int, default=None,
                    help="pipeline depth (default: choose_tiles' for the tile, moe_tile_choice.default_stages)")
    ap.add_argument("--wide-stages", type=int, default=None,
                    help="pipeline depth of the wide tile's loops (default: choose_tiles', "
                         "MoeTuning.wide_tile_stages)")
    ap.add_argument("--no-asm", action="store_true", help="without the PTX byte permute")
    ap.add_argument("--maxnreg", type=int, help="register cap per thread (MoeTiles.maxnreg)")
    ap.add_argument("--interleave", action="store_true", help="gate_up: MoeTiles.gate_up_interleave")
    ap.add_argument("--split-up", type=int, default=1, help="gate_up: K ranges per row tile (MoeTiles.split_up)")
    ap.add_argument("--apart", action="store_true", help="gate_up: MoeTiles.gate_up_apart")
    ap.add_argument("--sums-fp16", action="store_true", help="gate_up: MoeTiles.gate_up_sums_fp16 (gu in fp16)")
    ap.add_argument("--out", type=Path, help="also write the counts as JSON")
    args = ap.parse_args()
    tuning = MoeTuning()
    if args.num_stages is None:
        args.num_stages = default_stages(args.block_m, args.block_m_wide, tuning)
    if args.wide_stages is None:
        args.wide_stages = tuning.wide_tile_stages if args.block_m_wide else args.num_stages
    # PDL: as the H200 runs them (kernels/pdl.py; one wait at the kernel's start)
    constexprs = {"BN": args.block_n, "BM": args.block_m, "BM_WIDE": args.block_m_wide, "USE_ASM": not args.no_asm,
                  "PDL": True, "STAGES": args.num_stages, "STAGES_WIDE": args.wide_stages}
    if args.kernel == "gate_up":
        constexprs.update(SPLIT=args.split_up, INTERLEAVE=args.interleave, APART=args.apart)
    if args.kernel in ("down", "gate_up_down"):
        constexprs.update(HS_SUB=1, E_PAD=down_plan_width(args.experts), BALANCE=args.balance,
                          DOWN_COSTS=MoeTiles(balance_down=args.balance, down_zigzag=args.zigzag).down_cost_word)
    compiled = compile_kernel(args.kernel, constexprs, args.num_warps, args.num_stages, args.maxnreg,
                              {"gu_ptr": "*fp16"} if args.sums_fp16 else None)
    sass, regs, stack = cubin_sass(compiled.asm["cubin"])
    loops = inner_loops(sass, ("IDP",) if args.block_m == CUDA_CORE_TOKEN_TILE else TENSOR_CORE)
    print(f"triton {triton.__version__}, {args.kernel}, {constexprs}")
    for loop in loops:
        print(f"  loop {loop.start:#x}: {loop.instructions} instr, "
              + ", ".join(f"{k} {v}" for k, v in loop.counts.items()))
    print(f"registers {regs}, stack {stack} bytes, shared {compiled.metadata.shared} bytes")
    if args.out:
        args.out.write_text(json.dumps(dict(triton=triton.__version__, kernel=args.kernel, constexprs=constexprs,
                                            registers=regs, stack=stack,
                                            loops=[dict(start=lp.start, instructions=lp.instructions, **lp.counts)
                                                   for lp in loops]), indent=1))


if __name__ == "__main__":
    main()
