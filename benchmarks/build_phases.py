"""Where the synthetic model's build time goes: per expert block and per pinned slab.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/build_phases.py --blocks 48 --commit <sha> --out benchmarks/results/build_phases_h200.json

The e2e benchmark's build encodes 768 Mixtral-8x7B expert blocks and copies
each to pinned host pages at 12-16 blocks/s. This times, with a device sync
after each phase, the steps of that loop for ``--blocks`` blocks of
Mixtral's shapes: random matrix, ``encode``, ``HostPagePool.take`` (a new
1 GiB pinned slab every ~16 blocks), and the device-to-host copy of the
fields. Then it times bare pinned allocations of one slab, zeroed
(``torch.zeros``, what the pool does) and not (``torch.empty``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dataplane.weights.codec import encode  # noqa: E402
from dataplane.weights.host_pages import MAX_SLAB_BYTES, HostPagePool  # noqa: E402
from dataplane.weights.layout import NUM_FIELDS, field_size, pages_for  # noqa: E402

MIXTRAL_FFN, MIXTRAL_HIDDEN = 14336, 4096
PAGE_BYTES = 2 << 20  # the arena's page size in the e2e build


def timed(fn, device: torch.device):
    """(fn's result, seconds), device work included."""
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def block_phases(blocks: int, device: torch.device) -> list[dict]:
    pool = HostPagePool(PAGE_BYTES, pin=True)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for i in range(blocks):
        shape = (MIXTRAL_FFN, MIXTRAL_HIDDEN) if i % 3 < 2 else (MIXTRAL_HIDDEN, MIXTRAL_FFN)
        w, t_rand = timed(lambda: torch.empty(shape, device=device, dtype=torch.bfloat16).normal_(
            0.0, 0.02, generator=gen), device)
        blk, t_encode = timed(lambda: encode(w), device)
        t_take = t_copy = 0.0
        before = pool.allocated_bytes
        for f in range(NUM_FIELDS):
            data, t = timed(lambda: blk.field_bytes(f), device)
            t_copy += t
            n = pages_for(field_size(blk.n, blk.k, f).total, PAGE_BYTES)
            pages, t = timed(lambda: pool.take(n), device)
            t_take += t
            _, t = timed(lambda: pages.view(-1)[: data.numel()].copy_(data), device)
            t_copy += t
        rows.append({"block": i, "random_s": t_rand, "encode_s": t_encode, "take_s": t_take,
                     "bytes_s": t_copy, "new_slab": pool.allocated_bytes != before})
    return rows


def slab_allocations(repeats: int) -> dict:
    out = {}
    for name, make in (("zeros_pinned", torch.zeros), ("empty_pinned", torch.empty)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            slab = make(MAX_SLAB_BYTES, dtype=torch.uint8, pin_memory=True)
            times.append(time.perf_counter() - t0)
            del slab
        out[name] = times
    t0 = time.perf_counter()
    plain = torch.empty(MAX_SLAB_BYTES, dtype=torch.uint8)
    plain.zero_()
    out["zeros_pageable"] = [time.perf_counter() - t0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="bare slab allocations of each kind")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.empty(1, device=device)  # context first
    rows = block_phases(args.blocks, device)
    slabs = slab_allocations(args.repeats)
    phases = ("random_s", "encode_s", "take_s", "bytes_s")
    total = {p: sum(r[p] for r in rows) for p in phases}
    slab_takes = [r["take_s"] for r in rows if r["new_slab"]]
    result = {
        "command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "commit": args.commit,
        "page_bytes": PAGE_BYTES, "slab_bytes": MAX_SLAB_BYTES, "blocks": rows, "totals_s": total,
        "slab_allocations_s": slabs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{args.blocks} Mixtral blocks; seconds in all (per block):")
    for p in phases:
        print(f"  {p:9} {total[p]:7.2f} ({total[p] / len(rows) * 1e3:6.1f} ms)")
    print(f"  new slabs {len(slab_takes)}, their take median {statistics.median(slab_takes or [0.0]):.3f} s")
    for name, times in slabs.items():
        print(f"  1 GiB {name:15} median {statistics.median(times):.3f} s over {len(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
