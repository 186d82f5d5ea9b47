"""Where the synthetic model's build time goes: per expert block and per pinned slab.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/build_phases.py --blocks 48 --commit <sha> --out benchmarks/results/build_phases_h200.json

The e2e benchmark's build encodes 768 Mixtral-8x7B expert blocks and copies
each to pinned host pages at 12-16 blocks/s. This times, with a device sync
after each phase, the steps of that loop for ``--blocks`` blocks of
Mixtral's shapes: random matrix, ``encode``, ``HostPagePool.take`` (a new
1 GiB pinned slab every ~16 blocks), and the device-to-host copy of the
fields; and, beside ``encode``, the Triton ``quant_pack`` with the same
least-squares fit (its time, and whether its codes equal encode's). Then
it times fresh 1 GiB slabs, kept alive: ``torch.zeros(pin_memory=True)``
(the pool up to session 17; with ``PYTORCH_CUDA_ALLOC_CONF`` set, torch's
host-register options apply) and pageable zeros page-locked by
``cudaHostRegister`` (``HostPagePool`` since session 18).
"""

from __future__ import annotations

import argparse
import json
import os
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
from kernels.quant_pack import quant_pack  # noqa: E402

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
        packed, t_pack = timed(lambda: quant_pack(w, least_squares=True), device)
        pack_codes_equal = all(
            torch.equal(packed[f][: field_size(blk.n, blk.k, f).code_bytes],
                        blk.field_bytes(f)[: field_size(blk.n, blk.k, f).code_bytes])
            for f in range(NUM_FIELDS))
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
        rows.append({"block": i, "random_s": t_rand, "encode_s": t_encode, "quant_pack_lsq_s": t_pack,
                     "quant_pack_codes_equal": pack_codes_equal, "take_s": t_take,
                     "bytes_s": t_copy, "new_slab": pool.allocated_bytes != before})
    return rows


def fresh_slabs(kind: str, count: int, device: torch.device) -> dict:
    """Seconds to allocate ``count`` 1 GiB host slabs of ``kind``, all kept alive
    (so none comes from the caching host allocator), and the rate of a 1 GiB
    device-to-host copy into the last one (pinned memory copies at ~55 GB/s,
    pageable at a fraction of it)."""
    pool = HostPagePool(MAX_SLAB_BYTES, pin=True, slabs=False)  # a fresh 1 GiB buffer per take
    slabs, times = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        if kind == "torch_pinned":  # what HostPagePool did up to session 17
            slab = torch.zeros(MAX_SLAB_BYTES, dtype=torch.uint8, pin_memory=True)
        else:  # "registered": HostPagePool's pinned slab since session 18
            slab = pool.take(1).view(-1)
        times.append(time.perf_counter() - t0)
        slabs.append(slab)
    src = torch.ones(MAX_SLAB_BYTES, dtype=torch.uint8, device=device)
    _, t_copy = timed(lambda: slabs[-1].copy_(src, non_blocking=True), device)
    ok = bool(slabs[-1][:: 1 << 20].eq(1).all())
    pinned = slabs[-1].is_pinned()
    return {"alloc_s": times, "d2h_gb_per_s": MAX_SLAB_BYTES / t_copy / 1e9, "copy_ok": ok,
            "is_pinned": pinned}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--slabs", type=int, default=3, help="fresh 1 GiB slabs of each kind")
    parser.add_argument("--kinds", default="torch_pinned,registered")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.empty(1, device=device)  # context first
    rows = block_phases(args.blocks, device)
    kinds = args.kinds.split(",") if args.slabs > 0 else []  # --slabs 0: the block phases only
    slabs = {k: fresh_slabs(k, args.slabs, device) for k in kinds}
    phases = ("random_s", "encode_s", "quant_pack_lsq_s", "take_s", "bytes_s")
    slab_takes = [r["take_s"] for r in rows if r["new_slab"]]
    total = {p: sum(r[p] for r in rows) for p in phases}
    result = {
        "command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "commit": args.commit,
        "page_bytes": PAGE_BYTES, "slab_bytes": MAX_SLAB_BYTES, "blocks": rows, "totals_s": total,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "fresh_slabs": slabs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{args.blocks} Mixtral blocks; seconds in all (per block):")
    for p in phases:
        print(f"  {p:9} {total[p]:7.2f} ({total[p] / max(len(rows), 1) * 1e3:6.1f} ms)")
    print(f"  quant_pack codes equal encode's in {sum(r['quant_pack_codes_equal'] for r in rows)} of {len(rows)}")
    print(f"  new slabs {len(slab_takes)}, their take median {statistics.median(slab_takes or [0.0]):.3f} s")
    for name, r in slabs.items():
        print(f"  1 GiB {name:13} alloc median {statistics.median(r['alloc_s']):.3f} s over {len(r['alloc_s'])}, "
              f"D2H {r['d2h_gb_per_s']:.1f} GB/s, pinned {r['is_pinned']}, copy ok {r['copy_ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
