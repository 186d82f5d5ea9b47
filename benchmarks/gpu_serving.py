"""Serving on the GPU: the weight store's CUDA path and the engine's decode
throughput on the default model.

One command, writes JSON (``--out``) and prints a short table last:

    python benchmarks/gpu_serving.py --out benchmarks/results/serving_h200.json

Parts:
1. WeightStore on CUDA: demote every block to 2 bits, promote back to 8 on
   the side stream; every block decodes exactly as from the host master copy;
   promotion bandwidth (host -> arena).
2. Engine decode throughput on the default model (bf16), paged experts at
   8 bits through the plain-torch path (no fused kernel) vs dense experts.
(The memory-pressure scenario this script's third part once ran, in
serving_h200.json, is benchmarks/memory_pressure.py now.)
Runs on the CPU too (for a dry run), with smaller counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.provenance import git_commit  # noqa: E402
from dataplane.config import DataplaneConfig  # noqa: E402
from dataplane.engine_builder import build  # noqa: E402
from dataplane.engine_io import QueueSink  # noqa: E402
from dataplane.sampling_params import SamplingParams  # noqa: E402
from dataplane.warmup import engine_warmup_rounds, warm_up  # noqa: E402
from dataplane.weights.codec import decode_view, field_from_bytes  # noqa: E402
from dataplane.weights.layout import NUM_FIELDS, VIEW_BITS  # noqa: E402

MODEL = REPO / "models" / "pw-moe-tiny"
PROMPT_LEN = 64


# Seconds one warm-up round may take (dataplane/warmup.py; a fresh Triton
# cache compiles for ~30 s per tile class at Mixtral shapes).
WARM_UP_ROUND_TIMEOUT_S = 600.0


def prompt(i: int, vocab: int, length: int = PROMPT_LEN) -> list[int]:
    return [(31 * i + 7 * j) % (vocab - 10) + 10 for j in range(length)]


def run_requests(engine, n: int, max_tokens: int, prompt_len: int = PROMPT_LEN) -> tuple[float, int]:
    """Submits n requests at once; returns (seconds, tokens generated)."""
    vocab = engine.model_info.vocab_size
    sinks = []
    start = time.perf_counter()
    for i in range(n):
        sink = QueueSink()
        engine.add_request(f"q{i}-{time.monotonic_ns()}", prompt(i, vocab, prompt_len),
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True), sink)
        sinks.append(sink)
    tokens = sum(len(o.new_token_ids) for s in sinks for o in s.outputs(timeout=600))
    return time.perf_counter() - start, tokens


def part_store(device: str) -> dict:
    built = build(DataplaneConfig(model_path=str(MODEL), device=device, max_arena_pages=4096))
    store = built.precision.store
    n = store.num_blocks
    for b in range(n):
        store.demote(b, VIEW_BITS[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    moved = sum(store.promote(b, VIEW_BITS[-1]) for b in range(n))
    store.sync()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    exact = 0
    for b in range(n):
        bits, w = store.decode(b)  # through the device page table
        rows, cols = store.shape(b)
        parsed = [field_from_bytes(store.field_bytes(b, f), rows, cols, f) for f in range(NUM_FIELDS)]
        host = decode_view(tuple(c for c, _ in parsed), parsed[-1][1], rows, cols)  # host master copy
        exact += int(bits == VIEW_BITS[-1] and torch.equal(w.cpu(), host))
    return {
        "blocks_exact_after_round_trip": exact,
        "blocks": n, "bytes_promoted": moved, "promote_seconds": seconds,
        "promote_gb_per_s": moved / seconds / 1e9,
        "all_blocks_back_at_8_bits": all(store.bits(b) == 8 for b in range(n)),
        "arena_weight_pages_by_bits": built.engine.arena.snapshot().weight_pages_by_bits,
    }


def part_throughput(device: str, batches: list[int], max_tokens: int) -> list[dict]:
    rows = []
    for experts in ("paged", "dense"):
        built = build(DataplaneConfig(model_path=str(MODEL), device=device, expert_precision=experts,
                                      max_arena_pages=4096))
        engine = built.engine
        engine.start()
        try:
            # The served dataplane's own start-up warm-up: every kernel variant and decode graph first.
            warm_up(engine, engine_warmup_rounds(engine), WARM_UP_ROUND_TIMEOUT_S)
            for b in batches:
                seconds, tokens = run_requests(engine, b, max_tokens)
                rows.append({"experts": experts, "batch": b, "tokens": tokens, "seconds": seconds,
                             "tok_per_s": tokens / seconds})
        finally:
            engine.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    batches = [1, 16, 64] if on_gpu else [1, 4]
    result = {
        "command": " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
        "torch": torch.__version__,
        "commit": git_commit(args.commit),
        "model": str(MODEL.relative_to(REPO)),
    }
    result["store"] = part_store(args.device)
    result["throughput"] = part_throughput(args.device, batches, 64 if on_gpu else 8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nstore: {result['store']['bytes_promoted'] / 1e6:.1f} MB promoted in "
          f"{result['store']['promote_seconds'] * 1e3:.1f} ms ({result['store']['promote_gb_per_s']:.2f} GB/s), "
          f"all back at 8 bits: {result['store']['all_blocks_back_at_8_bits']}, "
          f"exact: {result['store']['blocks_exact_after_round_trip']}/{result['store']['blocks']}")
    print(f"{'experts':8} {'batch':>5} {'tok/s':>9}")
    for row in result["throughput"]:
        print(f"{row['experts']:8} {row['batch']:5d} {row['tok_per_s']:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
