"""MoE layer (and paged decode attention) benchmark on the GPU; writes JSON.

    python3 benchmarks/bench_moe.py --out results.json [--quick]

Times are medians of triton.testing.do_bench over CUDA-graph replays; each
replay runs the layer once per weight copy (R layers of the same shape in the
arena, rotated so the weights read are several times the 60 MB L2), and the
time per layer is the replay time / R. Bytes that must move = distinct experts
touched x their three blocks at their current views (codes + that view's
scales) + x (bf16) + the fp32 output. % HBM is against a device-to-device copy
measured in the same run (bytes read + written). The shared expert of
Qwen1.5-MoE is left out (routed experts only).

Routing: round-robin by default (equal loads: at Mixtral B=64 every expert
gets 16 tokens); --routing random draws each token's experts uniformly, so
loads vary as with a router. An expert over one token tile costs an extra
pass over its weights unless the launch has a wide tile (MoeTiles), and the
bytes counted stay one read per expert either way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.graph_timing import MAX_ROTATIONS, ROTATE_TARGET, bench_graph, copy_bandwidth  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.reference_rows import attention_rows, bf16_rows  # noqa: E402
from benchmarks.moe_setup import (  # noqa: E402
    MIXTRAL,
    QWEN,
    ROUTINGS,
    MoeShape,
    block_bytes,
    build_store,
    fields_config,
    projection_views,
    routing,
    touched_bytes,
    two_views,
)
from kernels.moe_align import moe_prepare  # noqa: E402
from kernels.moe_mixed import (  # noqa: E402
    PagedWeights,
    alloc_workspace,
    fused_moe_mixed,
    moe_mixed_reference,
    run_down,
    run_gate_up,
)
from kernels.moe_tile_choice import choose_tiles  # noqa: E402
from kernels.moe_tuning import MoeTuning  # noqa: E402

# Page sizes: the Mixtral KV block of 16 tokens is 2 MiB; Qwen's fields are
# under 1 MiB, so smaller pages keep the padding (and the store) small.
PAGE_BYTES = {MIXTRAL.name: 2 * 2**20, QWEN.name: 256 * 2**10}
BITS = ["8", "6", "4", "3", "2", "mixed"]
DEFAULT_TUNE = dict(use_asm=True)  # rows, warps, num_stages: choose_tiles' defaults per tile
BATCHES = [1, 4, 16, 64]
# Batch sizes whose --stage-bits rows also time each launch alone (B=4 left
# out of the table's to keep its time; 32 for the mixed probe of session 51).
STAGE_BATCHES = (1, 16, 32, 64)


def rotations(shape: MoeShape, smallest_bytes: int, cap: int) -> int:
    return max(1, min(cap, math.ceil(ROTATE_TARGET / max(1, smallest_bytes))))


def tiles_for(shape: MoeShape, batch: int, tune: dict, sms: int | None = None):
    """choose_tiles with a launch shape's keywords; its "tuning" entry (a
    JSON object of MoeTuning fields, e.g. {"one_token_one_launch": true})
    becomes the MoeTuning it takes."""
    kwargs = dict(tune)
    if isinstance(kwargs.get("tuning"), dict):
        kwargs["tuning"] = MoeTuning(**kwargs["tuning"])
    if sms is not None:
        kwargs["num_sms"] = sms
    return choose_tiles(batch, shape.top_k, shape.experts, shape.hidden, shape.ffn, **kwargs)


def check(shape: MoeShape, weights: PagedWeights, layers: int, tune: dict | None, batch: int = 2) -> float:
    """Relative error of the kernel against the fp32 reference (mixed bits;
    B = 2 takes the tensor-core tile, B = 1 the CUDA-core one)."""
    weights.block_fields.copy_(fields_config(shape, layers, "mixed"))
    ids, tw = routing(shape, batch, "cuda")
    x = torch.randn(batch, shape.hidden, device="cuda", dtype=torch.bfloat16)
    tiles = tiles_for(shape, batch, tune or DEFAULT_TUNE)
    out = fused_moe_mixed(x, ids, tw, weights, layers - 1, shape.experts, shape.ffn, tiles)
    ref = moe_mixed_reference(x, ids, tw, weights, layers - 1, shape.experts, shape.ffn)
    err = float((out - ref).norm() / ref.norm())
    print(f"{shape.name}: kernel vs fp32 reference at B={batch}, relative error {err:.2e}", flush=True)
    return err


# num_stages only where it differs from choose_tiles' default for the tile kind.
TUNE_CANDIDATES = [dict(block_n=128, num_warps=4, use_asm=True),
                   dict(block_n=128, num_warps=4, use_asm=True, maxnreg=128),
                   dict(block_n=128, num_stages=2, num_warps=4, use_asm=True, maxnreg=128),
                   dict(block_n=64, num_warps=4, use_asm=True, maxnreg=128),
                   dict(block_n=128, num_warps=4, use_asm=True, maxnreg=96),
                   dict(block_n=128, num_warps=8, use_asm=True, maxnreg=128),
                   dict(block_n=128, num_warps=4, use_asm=True, maxnreg=168),
                   dict(block_n=64, num_warps=4, use_asm=True),
                   dict(block_n=64, num_warps=4, use_asm=True, maxnreg=168)]
TUNE_CASES = [(1, "4"), (16, "4"), (64, "4"), (1, "2")]


def time_layer(shape, weights, layers, batch, bits, tune, route="roundrobin"):
    ids, tw = routing(shape, batch, "cuda", mode=route)
    x = torch.randn(batch, shape.hidden, device="cuda", dtype=torch.bfloat16)
    tiles = tiles_for(shape, batch, tune, torch.cuda.get_device_properties(0).multi_processor_count)
    ws = alloc_workspace(batch, shape.top_k, shape.hidden, shape.ffn, shape.experts, tiles, "cuda")
    cfg = fields_config(shape, layers, bits)
    weights.block_fields.copy_(cfg)
    ms = bench_graph(lambda i=0: fused_moe_mixed(x, ids, tw, weights, i % layers, shape.experts,
                                                 shape.ffn, tiles, ws), layers)
    return ms, ids, cfg, tiles, (x, tw, ws)


def autotune(shape, weights, layers, deadline, candidates=None, cases=None, route="roundrobin"):
    """Full-kernel timings of each candidate launch shape; the least total wins."""
    rows, best = [], None
    cases = cases or TUNE_CASES
    for tune in candidates or TUNE_CANDIDATES:
        if time.time() > deadline:
            break
        try:
            times = [time_layer(shape, weights, layers, b, bits, tune, route)[0] * 1e3 for b, bits in cases]
        except Exception as exc:  # a shape that fails to build is recorded, not fatal
            rows.append(dict(tune, error=repr(exc)[:300]))
            print(f"tune {tune} failed: {exc!r}"[:300], flush=True)
            continue
        rows.append(dict(tune, cases=cases, us=times))
        print(f"tune {tune}: " + " ".join(f"{t:.1f}" for t in times) + " us", flush=True)
        if best is None or sum(times) < best[0]:
            best = (sum(times), tune)
    return (best[1] if best else DEFAULT_TUNE), rows


def moe_rows(shape: MoeShape, batches, bits_list, hbm: float, tune: dict | None, deadline: float,
             stages=False, tune_log=None, tune_only=False, candidates=None, tune_cases=None,
             route="roundrobin", stage_bits=("4",), check_kernel=True):
    smallest = block_bytes(shape, 0, 1) * 2 + block_bytes(shape, 2, 1)  # one expert at 2 bits
    layers = rotations(shape, smallest * min(shape.experts, shape.top_k), MAX_ROTATIONS)
    page_bytes = PAGE_BYTES[shape.name]
    weights = build_store(shape, layers, page_bytes, "cuda")
    if tune_log is not None:
        tune, tune_log[:] = autotune(shape, weights, layers, deadline if tune_only else deadline - 120, candidates,
                                     tune_cases, route)
        print(f"chosen launch shape: {tune}", flush=True)
        if tune_only:
            return [dict(model=shape.name, tune=tune)]
    rows = [dict(model=shape.name, tune=tune)]
    if check_kernel:
        rows[0].update(check_rel_err=check(shape, weights, layers, tune),
                       check_rel_err_b1=check(shape, weights, layers, tune, batch=1))
    for batch in batches:
        for bits in bits_list:
            if time.time() > deadline:
                rows.append(dict(model=shape.name, batch=batch, bits=bits, skipped="time budget"))
                continue
            ms, ids, cfg, tiles, (x, tw, ws) = time_layer(shape, weights, layers, batch, bits,
                                                          tune or DEFAULT_TUNE, route)
            wbytes = touched_bytes(shape, ids, cfg, 0)
            abytes = batch * shape.hidden * (2 + 4)
            gbps = (wbytes + abytes) / ms / 1e6
            row = dict(model=shape.name, batch=batch, bits=bits, time_us=ms * 1e3,
                       weight_bytes=wbytes, act_bytes=abytes, GBps=gbps, pct_hbm=100 * gbps / hbm,
                       experts_touched=len(set(ids.reshape(-1).tolist())),
                       max_tokens_per_expert=int(torch.bincount(ids.reshape(-1).long()).max()),
                       routing=route, rotations=layers,
                       page_bytes=page_bytes, tiles=tiles.__dict__)
            if stages and (bits in stage_bits or "all" in stage_bits) and batch in STAGE_BATCHES:
                row["stage_us"] = stage_times(shape, x, ids, tw, weights, tiles, ws, layers, page_bytes)
            rows.append(row)
            print(f"{shape.name:18s} B={batch:3d} bits={bits:5s} {ms * 1e3:8.1f} us "
                  f"{gbps:7.0f} GB/s {100 * gbps / hbm:5.1f}% HBM", flush=True)
    del weights
    torch.cuda.empty_cache()
    return rows


def stage_times(shape, x, ids, tw, weights, tiles, ws, layers, page_bytes):
    """Each launch alone (its inputs left in the workspace by a full run)."""
    log2p = page_bytes.bit_length() - 1
    e, f, k = shape.experts, shape.ffn, shape.top_k
    return {
        "prepare": 1e3 * bench_graph(lambda i=0: moe_prepare(x, ids, e, ws.prep), layers),
        "gate_up": 1e3 * bench_graph(lambda i=0: run_gate_up(ws, weights, i % layers, e, k, f, tiles, log2p), layers),
        "down": 1e3 * bench_graph(lambda i=0: run_down(ws, tw, weights, i % layers, e, k, f, tiles, log2p), layers),
    }


def tune_from_sweep(path: str | None) -> dict | None:
    """Tile rows, num_stages with the least total time over all views (asm on)."""
    if not path or not Path(path).exists():
        return None
    rows = [r for r in json.loads(Path(path).read_text())["rows"] if "us" in r and r["asm"]]
    best = {}
    for bn, stages in {(r["bn"], r["stages"]) for r in rows}:
        sel = {r["nf"]: r["us"] for r in rows if r["bn"] == bn and r["stages"] == stages}
        if len(sel) == 5:
            best[(bn, stages)] = sum(sel.values())
    if not best:
        return None
    bn, stages = min(best, key=best.get)
    return dict(block_n=bn, num_stages=stages, use_asm=True)


def mixed_summaries(timed: list[dict]) -> tuple[list[dict], list[dict]]:
    """Rows with half their blocks at each of two views (moe_setup.two_views:
    the in-expert 'mixed' and whole-expert 'views-6.6.6-2.2.2' alike) against
    uniform 4-bit (2-6 only: the same bytes) and against the mean of their
    two views' uniform times (what per-view speed alone predicts)."""
    def uniform(row, bits):
        return next((r for r in timed if r["model"] == row["model"] and r["batch"] == row["batch"]
                     and r["bits"] == bits), None)

    mixed, vs_views = [], []
    for row in timed:
        views = two_views(row["bits"])
        if views is None:
            continue
        uni = uniform(row, "4")
        if views == (2, 6) and uni is not None:
            mixed.append(dict(model=row["model"], batch=row["batch"], bits=row["bits"], mixed_us=row["time_us"],
                              uniform4_us=uni["time_us"], slowdown_pct=100 * (row["time_us"] / uni["time_us"] - 1),
                              same_bytes=row["weight_bytes"] == uni["weight_bytes"]))
        lo, hi = uniform(row, str(views[0])), uniform(row, str(views[1]))
        if lo is not None and hi is not None:
            predicted = (lo["time_us"] + hi["time_us"]) / 2
            vs_views.append(dict(model=row["model"], batch=row["batch"], bits=row["bits"], mixed_us=row["time_us"],
                                 views_mean_us=predicted, excess_pct=100 * (row["time_us"] / predicted - 1)))
    return mixed, vs_views


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="B in {1, 64}, bits in {4, 2, mixed}")
    ap.add_argument("--sweep", help="sweep_decode.py JSON to pick num_stages / use_asm from")
    ap.add_argument("--autotune", action="store_true", help="time launch shapes on Mixtral first")
    ap.add_argument("--models", default="mixtral,qwen", help="comma list of mixtral, qwen")
    ap.add_argument("--tune-only", action="store_true", help="only the autotune table (implies --autotune)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later rows are skipped")
    ap.add_argument("--batches", help="comma list of batch sizes (default 1,4,16,64; --quick: 1,64)")
    ap.add_argument("--bits", help="comma list of views: 8,6,4,3,2,mixed (= mixed2-6) or mixedA-B "
                                   "(default all of BITS; --quick: 4,2,mixed)")
    ap.add_argument("--kernels-only", action="store_true", help="skip the bf16 torch and attention rows")
    ap.add_argument("--candidates", help="JSON list of launch shapes (choose_tiles keywords; \"tuning\": an "
                                         "object of MoeTuning fields) to autotune instead of TUNE_CANDIDATES")
    ap.add_argument("--tune-cases", help="comma list of B:bits cases to autotune on (default "
                                         "1:4,16:4,64:4,1:2)")
    ap.add_argument("--routing", default="roundrobin",
                    help=f"token-to-expert routing of the timed layers: one of {ROUTINGS} or roundrobin:N "
                         "(default roundrobin: equal loads)")
    ap.add_argument("--stage-bits", default="4", help="comma list of views whose rows also time each "
                                                      "launch alone at B in {1, 16, 32, 64} ('all' for every view)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the kernel-vs-reference check at B = 2 and 1 (its two launch shapes' compiles)")
    ap.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    args = ap.parse_args()
    tune_cases = None
    if args.tune_cases:
        tune_cases = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.tune_cases.split(",")]
    deadline = time.time() + args.budget
    torch.manual_seed(0)
    tune = tune_from_sweep(args.sweep)
    print(f"tiles tuned from sweep: {tune}", flush=True)
    batches = [1, 64] if args.quick else BATCHES
    bits = ["4", "2", "mixed"] if args.quick else BITS
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    if args.bits:
        bits = args.bits.split(",")
        unknown = {b for b in set(bits) - set(BITS) if not b.startswith(("mixed", "views-"))}
        if unknown:
            ap.error(f"unknown views {sorted(unknown)}; choose from {BITS}, mixedA-B or views-G.U.D-G.U.D")
        for b in bits:
            try:
                projection_views(b)
            except ValueError as exc:
                ap.error(str(exc))
    shapes = [s for s in (MIXTRAL, QWEN) if s.name.split("-")[0].split("1")[0] in args.models]
    for shape in shapes:  # roundrobin:N depends on the model's experts
        try:
            routing(shape, 1, "cpu", mode=args.routing)
        except ValueError as exc:
            ap.error(f"{shape.name}: {exc}")
    hbm = copy_bandwidth()
    print(f"device-to-device copy: {hbm:.0f} GB/s", flush=True)
    result = dict(gpu=torch.cuda.get_device_name(0), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  command=" ".join(sys.argv), git_commit=git_commit(args.commit), torch=torch.__version__,
                  triton=triton.__version__, copy_GBps=hbm, tuned=tune, moe=[], bf16=[],
                  attention=[])
    for shape in shapes:
        # Each model is tuned on its own (the best shape differs with the expert count).
        tune_log = [] if args.autotune or args.tune_only else None
        rows = moe_rows(shape, batches, bits, hbm, tune, deadline, stages=True, tune_log=tune_log,
                        tune_only=args.tune_only,
                        candidates=json.loads(args.candidates) if args.candidates else None,
                        tune_cases=tune_cases, route=args.routing, stage_bits=args.stage_bits.split(","),
                        check_kernel=not args.no_check)
        result["moe"] += rows
        if tune_log:
            result.setdefault("autotune", []).extend(dict(row, model=shape.name) for row in tune_log)
        Path(args.out).write_text(json.dumps(result, indent=1))
    for shape in shapes if not (args.tune_only or args.kernels_only) else []:
        if time.time() < deadline:
            result["bf16"] += bf16_rows(shape, batches, hbm)
    if time.time() < deadline and not (args.tune_only or args.kernels_only):
        result["attention"] = attention_rows(hbm)
    timed = [r for r in result["moe"] if "time_us" in r]
    mixed, vs_views = mixed_summaries(timed)
    result["mixed_vs_uniform4"] = mixed
    result["mixed_vs_views_mean"] = vs_views
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("\nmodel              B    bits   us      GB/s  %HBM")
    for r in timed:
        print(f"{r['model'][:18]:18s} {r['batch']:3d} {r['bits']:16s} {r['time_us']:7.1f} {r['GBps']:6.0f} "
              f"{r['pct_hbm']:5.1f}")
    staged = [r for r in timed if "stage_us" in r]
    if staged:
        print("\nper launch, us: model              B    bits     prepare  gate_up   down")
        for r in staged:
            st = r["stage_us"]
            print(f"{r['model'][:18]:18s} {r['batch']:3d} {r['bits']:16s} {st['prepare']:7.1f} {st['gate_up']:8.1f} "
                  f"{st['down']:7.1f}")
    for m in mixed:
        print(f"{m['bits']} vs 4-bit {m['model'][:12]} B={m['batch']}: {m['slowdown_pct']:+.1f}%")
    for m in vs_views:
        print(f"{m['bits']} vs mean of its views {m['model'][:12]} B={m['batch']}: {m['excess_pct']:+.1f}%")


if __name__ == "__main__":
    main()
