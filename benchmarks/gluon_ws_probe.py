"""Does a warp-specialised data path lift the 16-token tensor-core MoE step?
A probe in Gluon (triton.experimental.gluon, Triton 3.6), not a kernel of
the engine; the kernel is benchmarks/gluon_ws_kernel.py.

The engine's 16-token tile (kernels/moe_block_matmul.py) runs each 128 x 128
group step in every thread: issue the next stage's cp.async, wait for this
one, barrier, read the fields from shared memory, decode, wgmma, scale. At
4 bits a step took ~1.03 us per program at Mixtral B=16 (benchmarks/NOTES.md,
session 12), of which the decode -> wgmma -> scale chain alone is ~0.5-0.7 us
(benchmarks/gluon_overlap_probe.py). Here a producer partition fills a ring
of shared-memory slots and a consumer warpgroup only reads, decodes,
multiplies and scales, so the data path leaves the consumer's chain.

Shape: Mixtral-8x7B's gate/up at B=16, every row tile of all 8 experts'
gate and up (229,376 rows x 4,096), 4-bit codes with an fp16 scale and
offset per row and 128-wide group (w = o + s q), 16 tokens. Bytes per (tile,
group): 8 KiB of codes and 512 B of scales from HBM (what GB/s counts),
4 KiB of activations and 64 B of their group sums from the L2.

A form (--configs, Config) is stages:programs_per_sm:maxnreg:mma:x_mode:
x_copies[:groups_per_slot]: the product wgmma | v2 (mma.sync) | none (no
product) | nodecode (wgmma of the code words unmasked: no decode) | stream
(slots released unread: the copies' own ceiling); the
copies box | flat | once (no activations after the ring fills) | swz128 (TMA
boxes) or cpasync (a producer warpgroup by 16-byte cp.async); x_copies
copies of the activations in memory; groups per ring slot (cpasync). "none",
"nodecode", "stream" and "once" compute a wrong product by design (timing
only). Every form is timed in --rounds interleaved rounds, each after 0.2 s
of warm-up launches (time_launch).

Measured (H200, benchmarks/results/gluon_ws_probe_h200_s32.json, NOTES
session 32): the best full step 2.50-2.60 TB/s (60-62 % of the copy), the
engine's whole 4-bit B=16 layer 2.39 TB/s (session 21); TMA copies alone
2.4-2.9 TB/s in every box shape and depth, cp.async from a producer
warpgroup 3.3 TB/s in the call where TMA's took 2.7; in one call the full
step runs 16-27 % under its copies' ceiling and the step without the
product 6-16 %; a third program per multiprocessor brought no clear gain;
mma.sync ran within -9 % / +8 % of wgmma. groups_per_slot > 1 is built but
was not measured (no device time left).

    python3 benchmarks/gluon_ws_probe.py --out benchmarks/results/gluon_ws_probe_h200.json
    PYTHONPATH=/tmp/t36:. python benchmarks/gluon_ws_probe.py --compile-only   # local sm_90 SASS
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gluon_ws_kernel import (CODES_LAYOUT, SWZ128_WORDS, WIDE_CODE_ROWS, WIDE_LAYOUT,  # noqa: E402
                                        X_FLAT_LAYOUT, X_FLAT_ROWS, X_LAYOUT, X_WIDE_LAYOUT, X_WIDE_ROWS, _ws_kernel)
from benchmarks.gluon_ws_layout import (BK, BM, BN, CODE_ROWS, EXPERTS, HIDDEN, INTERMEDIATE,  # noqa: E402
                                        SUBNORMAL_SCALE, Config, pack_codes, pack_scales, reference,
                                        swizzle32_order, swizzle128_order)

# Opcodes counted by --compile-only.
COUNTED = ("HGMMA", "HMMA", "LDSM", "LDS", "LDG", "STL", "LDL", "SYNCS", "LOP3", "SHF", "PRMT", "UTMALDG", "BAR",
           "FFMA")
# What marks the consumer's loop in the SASS (--compile-only).
CONSUMER_OPS = ("HGMMA", "HMMA", "FFMA")
# A step's scales as a TMA box (every TMA form): one row of BN words.
SCALES_BLOCK = [1, BN]


def x_block_shape(config: Config) -> list[int]:
    return {"flat": [X_FLAT_ROWS.value, 256], "swz128": [X_WIDE_ROWS.value, 64]}.get(config.x_mode,
                                                                                     [BK, BM])


def x_desc_layout(config: Config):
    return {"flat": X_FLAT_LAYOUT.value, "swz128": X_WIDE_LAYOUT.value}.get(config.x_mode, X_LAYOUT.value)


def codes_block_shape(config: Config) -> list[int]:
    return [WIDE_CODE_ROWS.value, SWZ128_WORDS.value] if config.x_mode == "swz128" else [CODE_ROWS, 128]


def codes_desc_layout(config: Config):
    return WIDE_LAYOUT.value if config.x_mode == "swz128" else CODES_LAYOUT.value


class Problem:
    """The probe's operands on the GPU (see the module docstring)."""

    def __init__(self, rows: int, k: int, max_x_copies: int, seed: int = 0, tokens: int = BM):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.rows, self.k = rows, k
        groups = k // BK
        self.q = torch.randint(0, 16, (rows, k), device="cuda", dtype=torch.uint8, generator=gen)
        self.s = (torch.rand(rows, groups, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
        self.o = (-8 * self.s.float()).half()
        self.x = (torch.randn(tokens, k, device="cuda", generator=gen)).half()  # [tokens, K]
        self.codes = pack_codes(self.q)
        self.scales = pack_scales(self.s, self.o)
        self.xt = self.x.t().contiguous()  # [K, tokens]
        self.max_x_copies = max_x_copies
        self.xsum = (self.x.float().view(tokens, -1, BK).sum(-1).t() / SUBNORMAL_SCALE).contiguous()
        self.out = torch.empty(rows, tokens, device="cuda", dtype=torch.float32)

    # The other forms' operands, built when a form first asks (the swizzled
    # codes alone are another 470 MB at full size).
    @functools.cached_property
    def x_flat(self) -> torch.Tensor:
        """[copies * groups * X_FLAT_ROWS, 256] fp16: each group's tile in its slot's byte order."""
        flat = self.xt.view(-1, BK * BM)[:, swizzle32_order().to(self.xt.device)]
        return flat.reshape(1, -1).expand(self.max_x_copies, -1).reshape(-1, 256).contiguous()

    @functools.cached_property
    def wide_codes(self) -> torch.Tensor:
        """swz128: [steps * WIDE_CODE_ROWS, 32] int32 codes in the swizzle's order."""
        step = self.codes.view(self.rows // BN * (self.k // BK), -1)
        order = swizzle128_order(step.shape[1], 4).to(step.device)
        return step[:, order].reshape(-1, SWZ128_WORDS.value).contiguous()

    @functools.cached_property
    def x_wide(self) -> torch.Tensor:
        """swz128: [copies * groups * X_WIDE_ROWS, 64] fp16 activations in the swizzle's order."""
        x_order = swizzle128_order(BK * BM, 2).to(self.xt.device)
        return self.x_flat.view(-1, BK * BM)[:, x_order].reshape(-1, 64).contiguous()

    def hbm_bytes(self) -> int:
        return self.codes.numel() * 4 + self.scales.numel() * 4

    def launch(self, config: Config, programs: int, producer_regs: int):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        if config.x_mode == "cpasync":
            # 16 tokens K-major per token pair ([K, 16]), 8 tokens as [8, K] (gluon_ws_kernel.X8_LAYOUT).
            descs = (self.codes, self.scales, self.x if self.x.shape[0] == 8 else self.xt, self.xsum)
        else:
            if config.x_mode == "swz128":
                codes, x = self.wide_codes, self.x_wide
            else:
                codes, x = self.codes, self.x_flat if config.x_mode == "flat" else self.xt
            descs = (TensorDescriptor.from_tensor(codes, codes_block_shape(config), codes_desc_layout(config)),
                     TensorDescriptor.from_tensor(self.scales, SCALES_BLOCK, CODES_LAYOUT.value),
                     TensorDescriptor.from_tensor(x, x_block_shape(config), x_desc_layout(config)), self.xsum)
        tiles, groups = self.rows // BN, self.k // BK
        return lambda: _ws_kernel[(programs,)](*descs, self.out, tiles, groups, config.x_copies,
                                               **config.constexprs(producer_regs),
                                               num_warps=config.consumer_warps,
                                               maxnreg=config.maxnreg)


def time_launch(launch, batches: int = 5, per_batch: int = 50, warmup_s: float = 0.2) -> float:
    """Median over batches of the mean ms of per_batch back-to-back launches
    (CUDA events around each batch), after warmup_s of launches: a form
    timed straight after another form, or after a compile, otherwise meets
    a GPU whose clocks have dropped (session 32: the first form of a call
    read up to 24 % slow)."""
    launch()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        for _ in range(per_batch):
            launch()
        torch.cuda.synchronize()
    means = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_batch):
            launch()
        end.record()
        torch.cuda.synchronize()
        means.append(start.elapsed_time(end) / per_batch)
    return sorted(means)[len(means) // 2]


def copy_bandwidth() -> float:
    """bytes/s of a 2 GiB device-to-device copy, read + write counted."""
    src = torch.empty(2**31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_launch(lambda: dst.copy_(src), per_batch=5)
    return 2 * src.numel() / (ms * 1e-3)


def compile_only(config: Config, producer_regs: int) -> dict:
    """Compile for sm_90 on this machine; the kernel's SASS opcode counts."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.sass_loops import SASS_LINE, cubin_sass, inner_loops, opcode

    def desc(dtype, block, layout):
        return f"tensordesc<{dtype}{list(block)},{layout!r}>"

    constexprs = config.constexprs(producer_regs)
    signature = {"codes_desc": desc("i32", codes_block_shape(config), codes_desc_layout(config)),
                 "scales_desc": desc("i32", SCALES_BLOCK, CODES_LAYOUT.value),
                 "x_desc": desc("fp16", x_block_shape(config), x_desc_layout(config)),
                 "xsum_ptr": "*fp32", "out_ptr": "*fp32", "n_tiles": "i32", "n_groups": "i32", "x_copies": "i32",
                 **{name: "constexpr" for name in constexprs}}
    if config.x_mode == "cpasync":
        signature.update(codes_desc="*i32", scales_desc="*i32", x_desc="*fp16")
    # Pointers 16-byte aligned, as the launches' tensors are (the JIT specialises on it).
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(signature.values()) if ty.startswith("*")}
    src = GluonASTSource(_ws_kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.consumer_warps, maxnreg=config.maxnreg))
    sass, regs, stack = cubin_sass(compiled.asm["cubin"])
    ops = [opcode(m.group(2)) for m in map(SASS_LINE.match, sass.splitlines()) if m]
    counts = {op: sum(1 for x in ops if x.startswith(op)) for op in COUNTED}
    # The consumer's step: the innermost loop around the products (or, with
    # none, the scale epilogue's FFMA).
    loops = [dict(start=hex(lp.start), instructions=lp.instructions) for lp in inner_loops(sass, CONSUMER_OPS)]
    # registers: the kernel's allocation a thread (maxnreg); the partitions
    # then move registers between them (setmaxnreg).
    return dict(**asdict(config), producer_regs=producer_regs, shared=compiled.metadata.shared, registers=regs,
                stack=stack, sass_counts=counts, sass_instructions=len(ops), loops=loops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile-only", action="store_true")
    # The default: the step taken apart (copies alone, no decode, no
    # product, the full step by wgmma and mma.sync) at one and two groups a
    # ring slot, all with the cp.async producer.
    forms = [f"4:2:128:{mma}:cpasync:1:{gps}" for gps in (1, 2) for mma in ("stream", "nodecode", "none", "wgmma", "v2")]
    ap.add_argument("--configs", default=",".join(forms),
                    help="stages:programs_per_sm:maxnreg:mma:x_mode:x_copies[:groups_per_slot[:consumer_warps"
                         "[:tokens]]], "
                         "comma-separated "
                         "(mma wgmma | v2 | none | nodecode | stream; x_mode box | flat | once | swz128 | cpasync)")
    ap.add_argument("--producer-regs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="timings of every form, interleaved; the median is kept")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    try:
        configs = [Config.parse(c) for c in args.configs.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.compile_only:
        for config in configs:
            print(json.dumps(compile_only(config, args.producer_regs)))
        return
    from benchmarks.provenance import git_commit

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = max(c.x_copies for c in configs)
    # One check and one full problem per token tile the forms use.
    checks = {t: Problem(rows=BN * 2 * sms + BN * 3, k=HIDDEN, max_x_copies=copies, seed=1, tokens=t)
              for t in sorted({c.tokens for c in configs})}
    refs = {t: reference(p.q, p.s, p.o, p.x) for t, p in checks.items()}
    fulls = {t: Problem(rows=EXPERTS * 2 * INTERMEDIATE, k=HIDDEN, max_x_copies=copies, tokens=t) for t in checks}
    full = next(iter(fulls.values()))  # for the sizes, the same in each
    copy = copy_bandwidth()
    steps = full.rows // BN * (full.k // BK)
    rows = []
    for config in configs:
        programs = config.per_sm * sms
        check, ref = checks[config.tokens], refs[config.tokens]
        check.out.fill_(float("nan"))
        check.launch(config, programs, args.producer_regs)()
        torch.cuda.synchronize()
        err = ((check.out - ref).norm() / ref.norm()).item()
        rows.append(dict(**asdict(config), programs=programs, producer_regs=args.producer_regs, rel_err=err,
                         timing_only=config.timing_only, written=bool(torch.isfinite(check.out).all().item()),
                         ms_rounds=[]))
    # Rounds over all forms, so that a drift of the GPU's speed within the
    # call spreads over every form instead of favouring the later ones.
    launches = [fulls[config.tokens].launch(config, row["programs"], args.producer_regs)
                for config, row in zip(configs, rows)]
    for _ in range(args.rounds):
        for launch, row in zip(launches, rows):
            row["ms_rounds"].append(time_launch(launch))
    for config, row in zip(configs, rows):
        ms = sorted(row["ms_rounds"])[len(row["ms_rounds"]) // 2]
        gbps = full.hbm_bytes() / (ms * 1e-3) / 1e9
        row.update(ms=ms, hbm_GBps=gbps, pct_copy=100 * gbps * 1e9 / copy,
                   ns_per_step_per_program=ms * 1e6 * row["programs"] / steps)
        spread = 100 * (max(row["ms_rounds"]) / min(row["ms_rounds"]) - 1)
        print(f"{config}: err {row['rel_err']:.2e}, {ms:.3f} ms, {gbps:.0f} GB/s ({row['pct_copy']:.1f} % of "
              f"copy), {row['ns_per_step_per_program']:.0f} ns/step/program, rounds spread {spread:.1f} %",
              flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                triton=triton.__version__, copy_GBps=copy / 1e9, rounds=args.rounds,
                timing="median over rounds of: median of 5 batches' mean of 50 back-to-back launches, "
                       "after 0.2 s of launches", rows_of_weights=full.rows, k=full.k,
                hbm_bytes=full.hbm_bytes())
    if args.out:
        args.out.write_text(json.dumps(dict(**meta, results=rows), indent=1))


if __name__ == "__main__":
    main()
