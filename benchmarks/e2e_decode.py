"""End-to-end decode of a synthetic model at real shapes through the engine.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/e2e_decode.py --preset mixtral-8x7b --out benchmarks/results/e2e_h200.json

The model is built in device memory (dataplane/models/synthetic.py: random
weights, experts drawn and encoded block by block into the arena), all experts
at the first of ``--bits``, then demoted in place to each next one (the
captured CUDA graphs stay valid: they read the page table at replay time).
For each batch size B, B requests with the same prompt length run together;
the timed window is the steps in which all B sequences decode.

Reported per (bits, B):
* step_ms: median wall time from ModelRunner.launch to the end of its
  collect over those steps (the forward, sampling, the device->host copy of
  the step's statistics, and the previous step's bookkeeping that the engine
  does in between while the device works);
* engine_step_ms: median time between consecutive step starts (adds the
  engine loop: scheduling, output delivery);
* tok_per_s = B / engine_step_ms;
* bytes per step: non-expert weights (all but the embedding, which is only
  gathered) + for each layer the distinct experts the step routed to x their
  bytes at the current bits (codes and scales, no page padding) + the KV
  cache read (context lengths x bytes per token);
* roofline_ms = bytes / measured copy bandwidth; pct_roofline = roofline_ms /
  engine_step_ms. The copy measured by a run moves between runs (3.90-4.22
  TB/s in session 16's calls on one H200), so pct_roofline_anchor divides by
  the fixed ANCHORS.md copy bandwidth instead: compare runs by it (or tok/s).
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.decode_batch import run_batch  # noqa: E402
from benchmarks.decode_profile import profile_decode  # noqa: E402
from benchmarks.e2e_knobs import add_knob_arguments, apply_knobs, knob_config  # noqa: E402
from benchmarks.precision_states import (MIXED_PREFIX, expert_bytes, precision_label, set_precision,  # noqa: E402
                                        state_bits)
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine_builder import build  # noqa: E402
from dataplane.kv_cache import kv_block_bytes  # noqa: E402
from dataplane.sampling_params import SamplingParams  # noqa: E402
from kernels.moe_tiles import BASE_TOKEN_TILE, NARROW_TOKEN_TILE  # noqa: E402

COPY_BYTES = 2 << 30
# Device-to-device copy of the H200 in ../shared/ANCHORS.md (bytes read +
# written per second, 2026-11-29): a fixed denominator for pct_roofline_anchor.
ANCHOR_COPY_BYTES_PER_S = 4.28e12


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy, bytes read + written per second (median of 20 after 3 warm-ups)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        if src.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if src.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * COPY_BYTES / statistics.median(times[3:])


@dataclass
class StepLog:
    """Per-step records of the runner (wrapped ``launch`` / ``collect``)."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    decode_rows: list[int] = field(default_factory=list)  # rows when decode-only, else 0
    routed: list[torch.Tensor] = field(default_factory=list)  # per step: int [layers, experts] tokens routed
    context_tokens: list[int] = field(default_factory=list)  # cached tokens read by the step

    def clear(self) -> None:
        for values in (self.starts, self.ends, self.decode_rows, self.routed, self.context_tokens):
            values.clear()


def instrument(runner, log: StepLog) -> None:
    """Records each step from the start of ``runner.launch`` (or ``launch_ahead``)
    to the end of its ``collect``."""
    launch, launch_ahead, collect = runner.launch, runner.launch_ahead, runner.collect
    started: dict[int, float] = {}  # id(launched step) -> its launch start

    def timed_launch(scheduled):
        start = time.perf_counter()
        step = launch(scheduled)
        started[id(step)] = start
        return step

    def timed_launch_ahead(scheduled, previous):
        start = time.perf_counter()
        step = launch_ahead(scheduled, previous)
        if step is not None:
            started[id(step)] = start
        return step

    def timed_collect(step):
        result = collect(step)
        log.ends.append(time.perf_counter())
        log.starts.append(started.pop(id(step)))
        scheduled = step.scheduled
        decode = all(item.num_new_tokens == 1 for item in scheduled)
        log.decode_rows.append(len(scheduled) if decode else 0)
        log.routed.append(result.routed_tokens)
        log.context_tokens.append(sum(item.start + item.num_new_tokens for item in scheduled))
        return result

    runner.launch, runner.launch_ahead, runner.collect = timed_launch, timed_launch_ahead, timed_collect


def measure(engine, log: StepLog, batch: int, prompt_len: int, steps: int, store, dense_bytes: int,
            kv_token_bytes: int, bandwidth: float, sampling: SamplingParams | None = None) -> dict:
    log.clear()
    tokens = run_batch(engine, batch, prompt_len, steps + 2, f"t{time.monotonic_ns()}-{batch}", sampling)
    idx = [i for i, rows in enumerate(log.decode_rows) if rows == batch]
    if len(idx) < 3:
        raise RuntimeError(f"only {len(idx)} full decode steps at B={batch}: {log.decode_rows}")
    step_s = statistics.median(log.ends[i] - log.starts[i] for i in idx)
    gaps = [log.starts[i + 1] - log.starts[i] for i in idx if i + 1 < len(log.starts)]
    engine_s = statistics.median(gaps) if gaps else step_s
    loads = [log.routed[i] for i in idx]  # int [layers, experts] per timed step
    layers = loads[0].shape[0]
    sizes = expert_bytes(store, *loads[0].shape)  # [layers, experts]
    moved = statistics.mean(float((sizes * (load > 0)).sum()) for load in loads)
    touched = statistics.mean(float((load > 0).sum()) for load in loads) / layers
    # Expert loads: the kernels stream an expert's weights once per token
    # tile, so loads over the launch's token tile (the narrow one up to
    # MoeTuning.narrow_tile_max_mean, else the base one) cost another pass,
    # or the wide tile.
    max_load = statistics.mean(float(load.max(dim=1).values.float().mean()) for load in loads)
    over_tile = statistics.mean(float((load > BASE_TOKEN_TILE).sum()) for load in loads) / layers
    over_narrow = statistics.mean(float((load > NARROW_TOKEN_TILE).sum()) for load in loads) / layers
    kv = statistics.mean(log.context_tokens[i] for i in idx) * kv_token_bytes
    total = dense_bytes + moved + kv
    roof = total / bandwidth
    bits = store.block_bits()
    return {
        "bits": precision_label(store),
        "mean_bits": sum(bits) / len(bits),
        "batch": batch,
        "decode_steps_timed": len(idx),
        "step_ms": step_s * 1e3,
        "engine_step_ms": engine_s * 1e3,
        "tok_per_s": batch / engine_s,
        "experts_touched_per_layer": touched,
        "max_tokens_per_expert": max_load,  # mean over steps and layers of the busiest expert's tokens
        "experts_over_base_tile_per_layer": over_tile,
        "experts_over_narrow_tile_per_layer": over_narrow,
        "bytes_per_step": total,
        "bytes_dense": dense_bytes,
        "bytes_experts": moved,
        "bytes_kv": kv,
        "roofline_ms": roof * 1e3,
        "pct_roofline": 100 * roof / engine_s,
        "pct_roofline_runner": 100 * roof / step_s,
        "pct_roofline_anchor": 100 * total / ANCHOR_COPY_BYTES_PER_S / engine_s,
        # Collapse check (random weights often converge on one token) and graph/eager agreement.
        "distinct_last_tokens": len({seq[-1] for seq in tokens}),
        "tokens_first_seqs": tokens[:4],
    }


class EngineThreadCalls:
    """Runs callables on the engine thread, between steps (the weight store is
    driven by that thread alone): wraps the engine's before_step hook."""

    def __init__(self, engine) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._then = engine.before_step
        engine.before_step = self._before_step

    def _before_step(self) -> None:
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                break
            fn()
            done.set()
        if self._then is not None:
            self._then()

    def run(self, fn, timeout: float = 300.0) -> None:
        done = threading.Event()
        self._calls.put((fn, done))
        if not done.wait(timeout):
            raise TimeoutError("the engine thread did not run the call")


def write_result(args, config: DataplaneConfig, engine, bandwidth: float, build_s: float, rows: list,
                 profiles: list, complete: bool) -> dict:
    """Writes the JSON of the run so far to args.out (after every row, so that
    a run cut by a timeout keeps its rows; complete marks the last write)."""
    graphs = engine.runner.graphs
    result = {
        "command": " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "commit": args.commit,
        "preset": args.preset,
        "fuse_qkv": not args.no_fuse_qkv,
        "fuse_moe_entry": not args.no_fuse_moe_entry,
        "dense_gemv_max_tokens": args.dense_gemv_max_tokens,
        "dense_mma_max_tokens": args.dense_mma_max_tokens,
        "dense_mma_tiles": args.dense_mma_tiles,
        "fuse_qkv_rotary": config.fuse_qkv_rotary,
        "pdl_max_rows": config.pdl_max_rows,
        "pdl_moe_weight_max_rows": config.pdl_moe_weight_max_rows,
        "moe_tuning": asdict(config.moe_tuning),
        # The earlier files' keys for these three.
        "one_token_stages": config.moe_tuning.one_token_stages,
        "one_token_maxnreg": config.moe_tuning.one_token_maxnreg,
        "tensor_core_stages": config.moe_tuning.tensor_core_stages,
        "overlap_steps": not args.no_overlap,
        "step_ms_means": "a step's launch to its collect; with overlap_steps the next step is launched in "
                         "between (about two steps); engine_step_ms and tok_per_s are the rates",
        "steps_launched_ahead": engine.runner.steps_launched_ahead,
        "prompt_len": args.prompt_len,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "build_seconds": build_s,
        "cuda_graphs": graphs is not None,
        "graph_captures": graphs.captures if graphs else 0,
        "graph_replays": graphs.replays if graphs else 0,
        "arena_pages": engine.arena.num_pages,
        "arena_page_bytes": engine.arena.page_bytes,
        "complete": complete,
        "rows": rows,
        "profiles": profiles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="mixtral-8x7b")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--bits", default="8,4",
                        help=f"precision states in order: bitwidths or {MIXED_PREFIX}AB (A/B bits by expert, "
                             f"e.g. {MIXED_PREFIX}26)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32, help="decode steps per timed run")
    parser.add_argument("--no-graphs", action="store_true", help="eager decode steps (no CUDA graphs)")
    parser.add_argument("--eager-too", action="store_true",
                        help="after the graph rows, the last bits again with eager steps")
    add_knob_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample the timed requests (seeded); 0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--logprobs", type=int, default=None,
                        help="the timed requests ask for logprobs with this many alternatives (their cost)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="the timed requests' frequency penalty (no steps launched ahead then)")
    parser.add_argument("--max-arena-pages", type=int, default=None,
                        help="DataplaneConfig.max_arena_pages (default: all free memory)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny presets)")
    parser.add_argument("--profile-batches", default="",
                        help="after the timed rows: profile decode at these batch sizes in the last "
                             "precision state of --bits (torch.profiler, kernel time per step by name)")
    parser.add_argument("--commit", default="unknown", help="git commit of the measured tree")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    states = args.bits.split(",")
    for state in states:
        state_bits(state)  # a misspelt state fails here, not after the build
    sampling = None
    if args.temperature > 0 or args.logprobs is not None or args.frequency_penalty:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, logprobs=args.logprobs,
                                  frequency_penalty=args.frequency_penalty)
    first_bits = state_bits(states[0])[0]
    bandwidth = copy_bandwidth(args.device)
    t0 = time.perf_counter()
    config = DataplaneConfig(
        synthetic=args.preset, device=args.device, dtype="bfloat16", initial_expert_bits=first_bits,
        dynamic_precision=False, max_running_seqs=max(batches), max_batched_tokens=4096,
        max_context_length=args.prompt_len + args.steps + 16, cuda_graphs=not args.no_graphs,
        max_arena_pages=args.max_arena_pages, **knob_config(args),
    )
    built = build(config)
    build_s = time.perf_counter() - t0
    engine, store = built.engine, built.precision.store
    runner = engine.runner
    apply_knobs(args, runner.model)  # before any step: no graph holds the defaults yet
    spec = runner.model.spec
    dense_bytes = sum(p.numel() * p.element_size() for n, p in runner.model.named_parameters()
                      if not p.is_meta and "embed_tokens" not in n)
    kv_token_bytes = kv_block_bytes(1, spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.bfloat16)
    log = StepLog()
    instrument(runner, log)
    on_engine = EngineThreadCalls(engine)
    engine.start()
    rows = []
    try:
        for b in batches:  # compile kernels, capture graphs
            run_batch(engine, b, args.prompt_len, 4, f"warm-{b}")
        for state in states:
            on_engine.run(lambda: set_precision(store, state))
            for b in batches:
                rows.append(measure(engine, log, b, args.prompt_len, args.steps, store, dense_bytes,
                                    kv_token_bytes, bandwidth, sampling))
                rows[-1]["mode"] = "graphs" if runner.graphs is not None else "eager"
                rows[-1]["sampling"] = "greedy" if sampling is None else (
                    f"T={args.temperature} top_p={args.top_p} logprobs={args.logprobs} "
                    f"frequency_penalty={args.frequency_penalty}")
                print(json.dumps(rows[-1]), flush=True)
                write_result(args, config, engine, bandwidth, build_s, rows, [], complete=False)
        if args.eager_too and runner.graphs is not None:
            graphs, runner.graphs = runner.graphs, None  # engine thread reads it per step
            for b in batches:
                rows.append(measure(engine, log, b, args.prompt_len, args.steps, store, dense_bytes,
                                    kv_token_bytes, bandwidth))
                rows[-1]["mode"] = "eager"
                print(json.dumps(rows[-1]), flush=True)
            runner.graphs = graphs
        profiles = [profile_decode(engine, int(b), args.steps, precision_label(store), runner.graphs is not None,
                                   config.pdl_max_rows)
                    for b in args.profile_batches.split(",") if b]
    finally:
        engine.stop()
    result = write_result(args, config, engine, bandwidth, build_s, rows, profiles, complete=True)
    print(f"\n{args.preset}: built in {build_s:.0f} s; copy {bandwidth / 1e12:.2f} TB/s; "
          f"graphs {result['graph_captures']} captured, {result['graph_replays']} replays")
    print(f"{'mode':6} {'bits':>9} {'B':>3} {'step ms':>8} {'eng ms':>8} {'tok/s':>8} {'GB/step':>8} {'roof ms':>8} "
          f"{'%roof':>6} {'%anchor':>7} {'max load':>8}")
    for r in rows:
        print(f"{r['mode']:6} {r['bits']:>9} {r['batch']:3d} {r['step_ms']:8.2f} {r['engine_step_ms']:8.2f} {r['tok_per_s']:8.1f} "
              f"{r['bytes_per_step'] / 1e9:8.2f} {r['roofline_ms']:8.2f} {r['pct_roofline']:6.1f} "
              f"{r['pct_roofline_anchor']:7.1f} {r['max_tokens_per_expert']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
