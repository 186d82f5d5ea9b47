"""Where does the engine's gate/up launch lose its ~20 %? A probe, not a kernel
of the engine.

Session 58 (benchmarks/NOTES.md) measured a plain skeleton of the 4-bit step
(benchmarks/int8_product_probe.py) streaming Mixtral-8x7B's gate/up bytes at
91-96 % of the copy, while the engine's gate/up launch alone reads the same
499 MB at 77-79 %. This probe runs the engine's own product,
kernels/moe_block_matmul.block_matmul, over the engine's paged store, with
the engine's gathered activation tiles (the prep's sorted ids), in a bare
launch: one program per (expert slot, 128 rows, gate or up), the grid
interleaved as the engine's at B = 16, the fp32 sum stored and nothing else
(no arrival counter, no SiLU combine, no h planes, no PDL). Forms:

* engine: kernels/moe_gate_up.run_gate_up itself with the shipped tiles
  (since session 61 with MoeTiles.gate_up_apart up to 64 tokens);
* combined: the launch with its SiLU combine in (gate_up_apart off; the
  engine before session 61);
* engine168: that launch capped at 168 registers a thread (3 programs
  per multiprocessor, as `any` has by itself);
* apart: run_gate_up with MoeTiles.gate_up_apart (a program per token
  tile, partial sums only: 168 registers), its combine launch included;
* apart1: the same with one token tile per expert (the launch for experts
  of at most block_m tokens, as the probe's round-robin routing gives
  them): no program in grid dimension 2 exits at once (apart's second
  token tile, 1792 programs at B = 16, does);
* combine: that combine launch alone (kernels/moe_combine.run_combine);
* any: block_matmul_any, the block's field count read at run time (the
  engine's five specialised loops in one kernel, its registers);
* nf3: block_matmul at the 4-bit view only (three fields, compile time).

engine - any is what the launch does around the product, any - nf3 what
the run-time view switch costs, nf3 - the skeleton what the paged fields,
their segments and the gathered tiles cost. Each form is a name and a
pipeline depth, name:stages (the engine forms take the shipped tiles' depth).

    python3 benchmarks/block_matmul_probe.py --out benchmarks/results/block_matmul_probe.json
    PYTHONPATH=/tmp/t36:. python benchmarks/block_matmul_probe.py --compile-only   # local sm_90 SASS
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import weight_layout as wl  # noqa: E402
from kernels.moe_block_matmul import block_matmul, block_matmul_any  # noqa: E402

# The engine's own gate/up launches (run_gate_up), as MoeTiles changes to the shipped tiles of the batch.
ENGINE_FORMS = {"engine": {}, "combined": {"gate_up_apart": False},
                "engine168": {"gate_up_apart": False, "maxnreg": 168}, "apart": {"gate_up_apart": True}}
# The launches of MoeTiles.gate_up_apart taken apart: one token tile an expert, or the combine launch alone.
APART_FORMS = ("apart1", "combine")
FORMS = (*ENGINE_FORMS, *APART_FORMS, "any", "nf3")
FOUR_BIT_FIELDS = tl.constexpr(wl.fields_for_bits(4))
GRAPH_REPS = 4  # launches a graph replay (bench_moe's stage rows time one layer a launch)


@triton.jit
def block_probe_kernel(xp_ptr, xsum_ptr, sorted_ptr, offsets_ptr, arena_ptr, pt_ptr, bf_ptr, out_ptr,
                       block0, H, F, pt_block_stride, pt_field_stride, log2p, top_k, q_x,
                       BN: tl.constexpr, BM: tl.constexpr, STAGES: tl.constexpr, USE_ASM: tl.constexpr,
                       ANY: tl.constexpr):
    """out[pair, which, rows] = the gate (which 0) or up (1) rows [tile * BN,
    +BN) of expert program_id(0) times its tokens (the first BM of its range
    of the sorted list; the probe's experts hold at most BM), program_id(1) =
    tile * 2 + which. Arguments as kernels/moe_gate_up._moe_gate_up_kernel's;
    out_ptr: fp32 [pairs, 2, F]. Experts hold their ids in order (slot =
    expert): no active list.
    """
    expert = tl.program_id(0)
    pid = tl.program_id(1)
    tile = pid // 2
    which = pid % 2
    blk = block0 + expert * 3 + which
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    m = tl.arange(0, BM)
    pos = start + m
    valid = pos < end
    tok = (tl.load(sorted_ptr + pos, mask=valid, other=0) // top_k).to(tl.int64)
    xt_ptrs = xp_ptr + tok[None, :] * H + tl.arange(0, 128)[:, None]  # [128, BM] group 0
    xs_ptrs = xsum_ptr + tok * (H // 128)  # [BM]
    n = tile * BN + tl.arange(0, BN)
    rows = tl.minimum(n, F - 1)
    pt_blk = pt_ptr + blk.to(tl.int64) * pt_block_stride
    if ANY:
        nf = tl.load(bf_ptr + blk)
        acc = block_matmul_any(nf, arena_ptr, pt_blk, pt_field_stride, F, H, rows, 0, H // 128, log2p, xt_ptrs,
                               valid[None, :], xs_ptrs, valid, 1, q_x, xsum_ptr, 1, BN, BM, USE_ASM, STAGES)
    else:
        acc = block_matmul(arena_ptr, pt_blk, pt_field_stride, F, H, rows, 0, H // 128, log2p, xt_ptrs,
                           valid[None, :], xs_ptrs, valid, 1, q_x, xsum_ptr, 1, FOUR_BIT_FIELDS, BN, BM, USE_ASM,
                           STAGES)
    out = out_ptr + (pos.to(tl.int64)[None, :] * 2 + which) * F + n[:, None]
    tl.store(out, acc, mask=(n < F)[:, None] & valid[None, :])


def launch_probe(form: str, stages: int, ws, weights, layer: int, experts: int, top_k: int, ffn: int, tiles,
                 log2p: int, out: torch.Tensor):
    """A callable running one form once over the workspace's prepared tokens
    (after moe_prepare); out: fp32 [pairs, 2, ffn]."""
    from kernels.moe_mixed import run_gate_up
    from kernels.moe_paged import PROJS_PER_EXPERT

    if form in ENGINE_FORMS:
        engine_tiles = replace(tiles, **ENGINE_FORMS[form])
        return lambda: run_gate_up(ws, weights, layer, experts, top_k, ffn, engine_tiles, log2p)
    if form in APART_FORMS:
        from kernels.moe_combine import run_combine

        apart = replace(tiles, gate_up_apart=True)
        if form == "combine":
            return lambda: run_combine(ws, weights, layer, experts, top_k, ffn, apart)
        if form == "apart1":
            from kernels.moe_gate_up import _launch_gate_up
            from kernels.pdl import DEFAULT_PDL

            pdl, bm, st = DEFAULT_PDL, apart.block_m, apart.num_stages  # as run_gate_up by default
            return lambda: (_launch_gate_up(ws, weights, layer, experts, top_k, ffn, apart, log2p, pdl, bm, 0, st,
                                            st, 0, bm),
                            run_combine(ws, weights, layer, experts, top_k, ffn, apart, pdl))
    hidden = ws.prep.xp.shape[1]
    pt = weights.page_table
    grid = (experts, 2 * (ffn // tiles.block_n_up))
    return lambda: block_probe_kernel[grid](
        ws.prep.xp, ws.prep.xsum, ws.prep.sorted_ids, ws.prep.offsets, weights.storage.view(torch.int32), pt,
        weights.block_fields, out, layer * experts * PROJS_PER_EXPERT, hidden, ffn, pt.stride(0), pt.stride(1),
        log2p, top_k, ws.prep.xp.numel(), BN=tiles.block_n_up, BM=tiles.block_m, STAGES=stages,
        USE_ASM=tiles.use_asm, ANY=form == "any", num_warps=tiles.num_warps, num_stages=stages)


def parse_form(text: str) -> tuple[str, int]:
    name, _, stages = text.partition(":")
    if name not in FORMS or not stages.isdigit():
        raise ValueError(f"bad form {text!r}: name:stages, name in {FORMS}")
    return name, int(stages)


def prepare(shape, batch: int, page_bytes: int, device: str, sms: int):
    """(ws, weights, tiles, ids): a one-layer paged store of the shape at 4
    bits, round-robin routing of `batch` tokens prepared (moe_prepare) into a
    workspace for the shipped tiles of that batch."""
    from benchmarks.moe_setup import build_store, fields_config, routing
    from kernels.moe_align import moe_prepare
    from kernels.moe_mixed import alloc_workspace
    from kernels.moe_tile_choice import choose_tiles
    from kernels.moe_tuning import MoeTuning

    weights = build_store(shape, 1, page_bytes, device)
    weights.block_fields.copy_(fields_config(shape, 1, "4"))
    ids, _ = routing(shape, batch, device)
    x = torch.randn(batch, shape.hidden, device=device, dtype=torch.bfloat16)
    # fp32 sums (not the shipped fp16): the bare forms store fp32, and every
    # form's sums are checked against the engine's to 1e-5.
    tiles = choose_tiles(batch, shape.top_k, shape.experts, shape.hidden, shape.ffn, sms, use_asm=device == "cuda",
                         tuning=MoeTuning(gate_up_sums_fp16=False))
    if tiles.block_m_wide or tiles.split_up > 1 or not tiles.gate_up_interleave or tiles.block_m == 1:
        raise ValueError(f"the probe mirrors the one-tile interleaved tensor-core gate/up launch; B={batch} "
                         f"gives {tiles}")
    ws = alloc_workspace(batch, shape.top_k, shape.hidden, shape.ffn, shape.experts, tiles, device)
    moe_prepare(x, ids, shape.experts, ws.prep)
    return ws, weights, tiles, ids


def run_forms(forms, shape, ws, weights, tiles, log2p: int) -> tuple[list, list]:
    """(launches, rows): each form run once, its sums checked against the
    engine's gate/up pre-activations (ws.gu, left by an engine run first;
    the engine forms' own sums are ws.gu after their run)."""
    pairs = ws.prep.sorted_ids.numel()
    outs = [torch.zeros(pairs, 2, shape.ffn, device=ws.gu.device) for _ in forms]
    launches = [launch_probe(name, stages, ws, weights, 0, shape.experts, shape.top_k, shape.ffn, tiles, log2p, out)
                for (name, stages), out in zip(forms, outs)]
    launch_probe("engine", 0, ws, weights, 0, shape.experts, shape.top_k, shape.ffn, tiles, log2p, outs[0])()
    gu = ws.gu[:, 0].float().clone()  # [pairs, 2, F]
    plane = wl.view_plane(wl.fields_for_bits(4))  # the h plane 4-bit down blocks read (combine_one_plane's only one)
    h = ws.h_planes[plane].float().clone()  # [pairs, F]
    rows = []
    for (name, stages), launch, out in zip(forms, launches, outs):
        if name in ENGINE_FORMS or name == "apart1":
            ws.gu.zero_()  # so that a form that wrote nothing fails
        if name == "combine":
            ws.h_planes[plane].zero_()
        launch()
        got = ws.gu[:, 0].float() if name in ENGINE_FORMS or name == "apart1" else out
        want = gu
        if name == "combine":  # its h against the engine's
            got, want = ws.h_planes[plane].float(), h
        err = None if name == "engine" else ((got - want).norm() / want.norm()).item()
        rows.append(dict(form=name, stages=stages, rel_err_vs_engine=err, ms_rounds=[]))
    return launches, rows


def compile_only(name: str, stages: int, block_m: int = 8) -> str:
    """A probe form's registers, stack and loop lengths, compiled for sm_90
    here (the shipped B=16 tile: 128 rows, 4 warps)."""
    from benchmarks.sass_loops import compile_jit, compile_kernel, cubin_sass, inner_loops
    from kernels.moe_tile_choice import choose_tiles

    if name in ENGINE_FORMS:  # as sass_loops.py gate_up --block-m 8 --interleave [--apart] [--maxnreg 168]
        tiles = replace(choose_tiles(16, 2, 8, 4096, 14336, use_asm=True), **ENGINE_FORMS[name])
        compiled = compile_kernel("gate_up", dict(BN=128, BM=block_m, BM_WIDE=0, USE_ASM=True, PDL=True, STAGES=stages,
                                                  STAGES_WIDE=stages, SPLIT=1, INTERLEAVE=True,
                                                  APART=tiles.gate_up_apart), 4, stages, tiles.maxnreg)
    elif name == "combine":
        from kernels.moe_combine import COMBINE_WARPS, _moe_combine_kernel

        compiled = compile_jit(_moe_combine_kernel, dict(BN=128, BM=block_m, BM_WIDE=0, USE_ASM=True, PDL=True,
                                                         SPLIT=1), COMBINE_WARPS, 1)
    else:
        compiled = compile_jit(block_probe_kernel, dict(BN=128, BM=block_m, STAGES=stages, USE_ASM=True,
                                                        ANY=name == "any"), 4, stages)
    sass, regs, stack = cubin_sass(compiled.asm["cubin"])
    loops = [lp.instructions for lp in inner_loops(sass)]
    return f"{name}:{stages}: registers {regs}, stack {stack} bytes, loops {loops} instructions"


def main() -> None:
    from benchmarks.bench_moe import PAGE_BYTES
    from benchmarks.graph_timing import bench_graph, copy_bandwidth
    from benchmarks.moe_setup import MIXTRAL, block_bytes
    from benchmarks.provenance import git_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--forms", default="engine:4,any:4,nf3:4", help="name:stages, comma-separated")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--compile-only", action="store_true", help="sm_90 registers and loop lengths, no GPU")
    args = ap.parse_args()
    try:
        forms = [parse_form(f) for f in args.forms.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.compile_only:
        for name, stages in forms:
            print(compile_only(name, stages))
        return
    shape, page_bytes = MIXTRAL, PAGE_BYTES[MIXTRAL.name]
    log2p = page_bytes.bit_length() - 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws, weights, tiles, ids = prepare(shape, args.batch, page_bytes, "cuda", sms)
    launches, rows = run_forms(forms, shape, ws, weights, tiles, log2p)
    copy = copy_bandwidth()
    for _ in range(args.rounds):  # interleaved, so that a drift of the clocks spreads over every form
        for launch, row in zip(launches, rows):
            row["ms_rounds"].append(bench_graph(lambda i=0, run=launch: run(), GRAPH_REPS))
    gate_up_bytes = sum(block_bytes(shape, proj, FOUR_BIT_FIELDS.value) for proj in (0, 1))  # codes + scales
    hbm_bytes = len(set(ids.reshape(-1).tolist())) * gate_up_bytes
    print("| form | stages | rel err vs engine | us | GB/s | % copy |\n|---|---|---|---|---|---|")
    for row in rows:
        ms = sorted(row["ms_rounds"])[len(row["ms_rounds"]) // 2]
        gbps = hbm_bytes / (ms * 1e-3) / 1e9
        row.update(ms=ms, hbm_GBps=gbps, pct_copy=100 * gbps / copy)
        err = "-" if row["rel_err_vs_engine"] is None else f"{row['rel_err_vs_engine']:.1e}"
        print(f"| {row['form']} | {row['stages']} | {err} | {ms * 1e3:.1f} | {gbps:.0f} | {row['pct_copy']:.1f} |",
              flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                triton=triton.__version__, copy_GBps=copy, rounds=args.rounds, batch=args.batch,
                tiles=tiles.__dict__, hbm_bytes=hbm_bytes,
                timing=f"median over rounds of graph_timing.bench_graph ({GRAPH_REPS} launches a replay)")
    if args.out:
        args.out.write_text(json.dumps(dict(**meta, results=rows), indent=1))


if __name__ == "__main__":
    main()
