"""Would int8 products lift the tensor-core MoE step? A probe, not a kernel of
the engine; the kernel is benchmarks/int8_product_kernel.py.

Every session since 32 found the 4-bit 16-token step bound by its own chain
at two warps a scheduler (benchmarks/NOTES.md, session 57's list): the
decode (about 1.1 instructions a weight at 4 bits) and the fp16 products
(k16 an instruction) are most of it. Products on int8 activations (one
scale per token and 128-wide group, the group's scale already applied per
step) take k32 an instruction and need only the codes shifted into bytes
(0.375 instructions a weight). This probe runs both forms, and the copies
alone, in one kernel skeleton (the engine's: one 128-row tile a program,
Triton's pipeliner over the groups, the scales tied into the decode) on
Mixtral-8x7B's gate/up at B = 16 and 8: 229,376 rows x 4,096, 4-bit codes
with an fp16 scale and offset per row and group, 499 MB of codes + scales
a pass (what GB/s counts).

A form (--configs) is mode:tokens_tile:stages[:per_sm]: mode fp16 | int8
| stream | fields (the last two timing only; fields: the engine's
three-field read and decode of the same bytes); per_sm: programs per
multiprocessor looping over the tiles, to bound the resident programs as
the engine's 255 registers bound them to 2 (default: one a tile). Each is
first checked at a small irregular shape (5 tiles, K = 640, 13 or 5 tokens) against the fp32 reference of the values it
multiplies (rel_err), and int8 also against the fp16 activations
(rel_err_vs_fp16_x: what quantizing the activations costs); then every form
is timed in --rounds interleaved rounds (gluon_ws_probe.time_launch).

    python3 benchmarks/int8_product_probe.py --out benchmarks/results/int8_product_probe.json
    PYTHONPATH=/tmp/t36:. python benchmarks/int8_product_probe.py --compile-only   # local sm_90 SASS
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.int8_product_kernel import MODES, int8_probe_kernel  # noqa: E402

BN, BK, WORDS = 128, 128, 16
EXPERTS, HIDDEN, INTERMEDIATE = 8, 4096, 14336
INT8_MAX = 127.0
TIMING_ONLY = ("stream", "fields")  # forms whose product is wrong by design
TILES = (8, 16, 32, 64)  # the product's tokens: mma.sync under 16, wgmma from 16
COUNTED = ("HGMMA", "IGMMA", "HMMA", "IMMA", "LOP3", "SHF", "PRMT", "FFMA", "FMUL", "I2FP", "LDS", "STS", "STSM",
           "LDGSTS", "LDG", "BAR.SYNC", "SHFL", "STL", "LDL")
PRODUCTS = ("HGMMA", "IGMMA", "HMMA", "IMMA", "FFMA")


@dataclass(frozen=True)
class Config:
    mode: str
    tile: int  # the product's tokens (BM)
    stages: int
    per_sm: int = 0  # programs per multiprocessor, each looping over tiles; 0: one program a tile

    @staticmethod
    def parse(text: str) -> "Config":
        mode, tile, stages, *per_sm = text.split(":")
        if mode not in MODES or int(tile) not in TILES or len(per_sm) > 1:
            raise ValueError(f"bad form {text!r}: mode:tile:stages[:per_sm], mode in {sorted(MODES)}, "
                             f"tile in {TILES}")
        return Config(mode, int(tile), int(stages), int(per_sm[0]) if per_sm else 0)


def virtual_position() -> torch.Tensor:
    """[c, i, j] -> in-group position of nibble j of word (c, i)."""
    c, i, j = torch.meshgrid(torch.arange(4), torch.arange(4), torch.arange(8), indexing="ij")
    return 32 * c + 8 * i + j


def column_position(mode: str, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(position, place) of each decoded column 0..127: the in-group position
    whose weight it holds and (fp16) the place 16^ab its code sits at, which
    the staged activations divide out (int8_product_kernel's column orders)."""
    pos, place = torch.empty(BK, dtype=torch.long), torch.ones(BK)
    vp = virtual_position()
    for c in range(4):
        for i in range(4):
            for a in range(2):
                for b in range(2):
                    for e in range(2):
                        if mode == "int8":  # (lh, e2, e1) = (a, b, e): nibble 2 (2 e2 + e1) + lh
                            j, p = 2 * (2 * b + e) + a, 1.0
                            col = (i * 32 + c * 8 + a * 4 + b * 2 + e if tile < 16 else
                                   i * 32 + a * 16 + c * 4 + b * 2 + e)
                        else:  # (s, ab, e) = (a, b, e): nibble 2 s + ab + 4 e at place 16^ab
                            j, p = 2 * a + b + 4 * e, 16.0**b
                            col = (i * 32 + a * 16 + c * 4 + b * 2 + e if tile < 16 else
                                   i * 32 + a * 16 + b * 8 + c * 2 + e)
                        pos[col], place[col] = vp[c, i, j], p
    return pos, place


class Problem:
    """The probe's operands on the GPU (layout: int8_product_kernel)."""

    def __init__(self, rows: int, k: int, tokens: int, seed: int = 0, device: str = "cuda"):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.rows, self.k, self.tokens, self.groups = rows, k, tokens, k // BK
        self.q = torch.randint(0, 16, (rows, k), device=device, dtype=torch.uint8, generator=gen)
        self.s = (torch.rand(rows, self.groups, device=device, generator=gen) * 2e-3 + 1e-3).half()
        self.o = (-8 * self.s.float()).half()
        self.x = torch.randn(tokens, k, device=device, generator=gen).half()  # [tokens, K]
        tiles = rows // BN
        # nibble j of word (c, i) = q at position 32 c + 8 i + j
        shifts = (4 * torch.arange(8, device=device, dtype=torch.int64))
        words = (self.q.view(rows, self.groups, 16, 8).to(torch.int64) << shifts).sum(-1)  # [rows, groups, 16]
        words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        self.codes = words.view(tiles, BN, self.groups, WORDS).permute(0, 2, 1, 3).contiguous()
        s_bits = self.s.view(torch.int16).to(torch.int32) & 0xFFFF
        o_bits = self.o.view(torch.int16).to(torch.int32)
        self.sw = (s_bits | (o_bits << 16)).view(tiles, BN, self.groups).permute(0, 2, 1).contiguous()
        # Int8 activations: one step a per (token, group), xq = round(x / a).
        xg = self.x.float().view(tokens, self.groups, BK)
        self.xa = (xg.abs().amax(-1).clamp_min(1e-8) / INT8_MAX)  # [tokens, groups]
        self.xq = torch.round(xg / self.xa[..., None]).clamp(-INT8_MAX, INT8_MAX)
        self.x_int8 = (self.xq * self.xa[..., None]).view(tokens, k)  # the values the int8 product multiplies
        self.out = torch.empty(rows, tokens, device=device, dtype=torch.float32)
        self._staged: dict = {}

    def staged(self, config: Config) -> tuple:
        """(xt, xsum, xscale) for a form, built once per (mode, tile)."""
        key = (config.mode, config.tile)
        if key not in self._staged:
            pos, place = (t.to(self.x.device) for t in column_position(config.mode, config.tile))
            bm, pad = config.tile, config.tile - self.tokens
            if config.mode == "int8":
                xq = self.xq[:, :, pos].to(torch.int8)  # [tokens, groups, BK] column order
                xt = torch.nn.functional.pad(xq.permute(1, 0, 2), (0, 0, 0, pad)).contiguous()  # [groups, BM, BK]
                sums = self.x_int8.view(self.tokens, self.groups, BK).sum(-1)
            else:
                xg = self.x.float().view(self.tokens, self.groups, BK)[:, :, pos] / place
                xt = torch.nn.functional.pad(xg.permute(1, 2, 0).half(), (0, pad)).contiguous()  # [groups, BK, BM]
                sums = self.x.float().view(self.tokens, self.groups, BK).sum(-1)
            xsum = torch.nn.functional.pad(sums.t(), (0, pad)).contiguous()  # [groups, BM]
            xscale = torch.nn.functional.pad(self.xa.t(), (0, pad)).contiguous()
            self._staged[key] = (xt, xsum, xscale)
        return self._staged[key]

    def hbm_bytes(self) -> int:
        return self.codes.numel() * 4 + self.sw.numel() * 4

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 [rows, tokens] = (o + s q) @ x^T."""
        w = (self.o.float().repeat_interleave(BK, 1) + self.s.float().repeat_interleave(BK, 1) * self.q.float())
        return w @ x.float().t()

    def launch(self, config: Config, use_asm: bool = True, sms: int | None = None):
        """A callable that runs the form once; use_asm False for the
        interpreter; sms: multiprocessors for per_sm (default: the GPU's)."""
        xt, xsum, xscale = self.staged(config)
        tiles = self.rows // BN
        programs = tiles
        if config.per_sm:
            sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
            programs = min(tiles, config.per_sm * sms)
        return lambda: int8_probe_kernel[(programs,)](self.codes, self.sw, xt, xsum, xscale, self.out, tiles,
                                                      self.groups, self.tokens, BM=config.tile,
                                                      MODE=MODES[config.mode], STAGES=config.stages,
                                                      USE_ASM=use_asm, num_warps=4)

    def check(self, config: Config, use_asm: bool = True, sms: int | None = None) -> dict:
        """Run the form once against the fp32 reference of the values it
        multiplies; int8 also against the fp16 activations."""
        self.out.fill_(float("nan"))
        self.launch(config, use_asm, sms)()
        ref = self.reference(self.x_int8 if config.mode == "int8" else self.x.float())
        row = dict(written=bool(torch.isfinite(self.out).all().item()),
                   rel_err=((self.out - ref).norm() / ref.norm()).item())
        if config.mode == "int8":
            ref16 = self.reference(self.x.float())
            row["rel_err_vs_fp16_x"] = ((self.out - ref16).norm() / ref16.norm()).item()
        return row


def compile_only(config: Config) -> dict:
    """Compile for sm_90 on this machine; the inner loop's SASS opcode counts."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from benchmarks.sass_loops import cubin_sass, inner_loops

    x_type = "*i8" if config.mode == "int8" else "*fp16"
    signature = {"codes_ptr": "*i32", "sw_ptr": "*i32", "xt_ptr": x_type, "xsum_ptr": "*fp32",
                 "xscale_ptr": "*fp32", "out_ptr": "*fp32", "n_tiles": "i32", "n_groups": "i32", "tokens": "i32",
                 "BM": "constexpr", "MODE": "constexpr", "STAGES": "constexpr", "USE_ASM": "constexpr"}
    constexprs = {"BM": config.tile, "MODE": MODES[config.mode], "STAGES": config.stages, "USE_ASM": True}
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(signature.values()) if ty.startswith("*")}
    attrs[(7,)] = [["tt.divisibility", 16]]
    src = ASTSource(int8_probe_kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    sass, regs, stack = cubin_sass(compiled.asm["cubin"])
    loops = [dict(instructions=lp.instructions, counts=lp.counts) for lp in inner_loops(sass, PRODUCTS, COUNTED)]
    return dict(**asdict(config), registers=regs, stack=stack, shared=compiled.metadata.shared, loops=loops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compile-only", action="store_true")
    forms = [f"{m}:{t}:4" for t in (16, 8) for m in ("stream", "fp16", "int8")]
    ap.add_argument("--configs", default=",".join(forms), help="mode:tile:stages[:per_sm], comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    try:
        configs = [Config.parse(c) for c in args.configs.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.compile_only:
        for config in configs:
            print(json.dumps(compile_only(config)))
        return
    from benchmarks.gluon_ws_probe import copy_bandwidth, time_launch
    from benchmarks.provenance import git_commit

    rows = []
    for config in configs:
        check = Problem(rows=5 * BN, k=5 * BK, tokens=config.tile - 3, seed=1)
        rows.append(dict(**asdict(config), timing_only=config.mode in TIMING_ONLY, **check.check(config),
                         ms_rounds=[]))
    copy = copy_bandwidth()
    fulls = {t: Problem(rows=EXPERTS * 2 * INTERMEDIATE, k=HIDDEN, tokens=t) for t in sorted({c.tile for c in configs})}
    launches = [fulls[c.tile].launch(c) for c in configs]
    for _ in range(args.rounds):  # interleaved, so that a drift of the clocks spreads over every form
        for launch, row in zip(launches, rows):
            row["ms_rounds"].append(time_launch(launch))
    full = next(iter(fulls.values()))
    for config, row in zip(configs, rows):
        ms = sorted(row["ms_rounds"])[len(row["ms_rounds"]) // 2]
        gbps = full.hbm_bytes() / (ms * 1e-3) / 1e9
        row.update(ms=ms, hbm_GBps=gbps, pct_copy=100 * gbps * 1e9 / copy)
    print("| form | rel err | vs fp16 x | ms | GB/s | % copy |\n|---|---|---|---|---|---|")
    for config, row in zip(configs, rows):
        print(f"| {config.mode}:{config.tile}:{config.stages}:{config.per_sm} | {row['rel_err']:.1e} | "
              f"{row.get('rel_err_vs_fp16_x', float('nan')):.1e} | {row['ms']:.3f} | {row['hbm_GBps']:.0f} | "
              f"{row['pct_copy']:.1f} |", flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                triton=triton.__version__, copy_GBps=copy / 1e9, rounds=args.rounds,
                timing="median over rounds of gluon_ws_probe.time_launch", rows_of_weights=full.rows, k=full.k,
                hbm_bytes=full.hbm_bytes())
    if args.out:
        args.out.write_text(json.dumps(dict(**meta, results=rows), indent=1))


if __name__ == "__main__":
    main()
