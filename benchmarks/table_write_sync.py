"""How long the host waits when it writes one entry of a device table while
a decode step is still running (GPU, seconds).

    python benchmarks/table_write_sync.py --out benchmarks/results/table_write_sync_h100.json

The weight store writes its device tables (``block_fields``, ``page_table``)
between decode steps, while the step launched ahead still runs. A slice
assignment ``t[i:i+1] = x`` is a fill kernel queued behind the step; an
element assignment ``t[i] = x`` was suspected of waiting for the stream
(the controller hook took ~20 ms per demotion with it in a Mixtral burst).
Here a queue of matrix products stands in for the step (``--busy-ms`` of GPU
work, measured first), queued as launches and as the replay of a CUDA graph
of them; then each way of writing is timed on the host, ``--repeats`` times,
with the queue refilled before each write. Writes JSON and prints a table.

On the H100, calibrated (table_write_sync_calibrated_h100_s43.json): behind
19.4 ms of products the element write took 18.7 ms median, the control
(a slice from pageable host memory) 18.9 ms, the slice 0.12 ms; behind a
21.1 ms graph replay 22.2 / 21.4 / 0.17 ms. The element write (a Python
scalar, copied from the host) waits for the queued work, as the burst's
~20 ms per demoting hook (one decode step) showed, and the slice (a fill
kernel) does not. The first two runs (table_write_sync_h100_s42.json,
table_write_sync_graph_h100_s43.json) had a miscalibrated probe: 3 products
(~0.5 ms) queued, and the element write and the control took ~0.5 ms, i.e.
the whole queue there too.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import git_commit  # noqa: E402

MATMUL_N = 4096  # one bf16 product of this size is ~0.1-0.2 ms on an H100/H200
TABLE_ENTRIES = 768  # Mixtral-8x7B's expert blocks


def queue_busy_work(a: torch.Tensor, products: int) -> None:
    for _ in range(products):
        torch.mm(a, a)


def products_for(a: torch.Tensor, busy_ms: float) -> int:
    """Matrix products that keep the stream busy for about ``busy_ms``, timed
    by CUDA events after a first product (cuBLAS's handle and workspace: with
    them inside the probe, sessions 42 and 43 queued 3 products, ~0.5 ms, not
    the 20 ms asked for)."""
    probe = 20
    queue_busy_work(a, 1)
    torch.cuda.synchronize()
    per_product_ms = queued_ms(lambda: queue_busy_work(a, probe)) / probe
    return max(1, round(busy_ms / per_product_ms))


def queued_ms(queue_work) -> float:
    """GPU milliseconds of the work ``queue_work()`` queues (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    queue_work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def captured_busy_work(a: torch.Tensor, products: int) -> torch.cuda.CUDAGraph:
    """The same products captured as one CUDA graph (the engine's decode
    steps are graph replays)."""
    queue_busy_work(a, 1)  # cuBLAS workspace and handles before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        queue_busy_work(a, products)
    return graph


def host_ms(write, queue_work, repeats: int) -> list[float]:
    """Host milliseconds of ``write()`` issued behind the work ``queue_work()`` queues."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        queue_work()
        start = time.perf_counter()
        write()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy-ms", type=float, default=20.0, help="GPU work queued before each write")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    table = torch.zeros(TABLE_ENTRIES, dtype=torch.int32, device="cuda")  # [blocks], like block_fields
    products = products_for(a, args.busy_ms)
    block = TABLE_ENTRIES // 2
    ways = {
        "element t[i] = x": lambda: table.__setitem__(block, 3),
        "slice t[i:i+1] = x": lambda: table.__setitem__(slice(block, block + 1), 3),
        # A control that must wait: a copy from pageable host memory (the old commit path).
        "slice t[i:i+1] = host": lambda: table.__setitem__(slice(block, block + 1), torch.tensor([3], dtype=torch.int32)),
    }
    graph = captured_busy_work(a, products)
    queues = {"products": lambda: queue_busy_work(a, products), "graph replay": graph.replay}
    rows = []
    for queued, queue_work in queues.items():
        busy = queued_ms(queue_work)
        for name, write in ways.items():
            times = host_ms(write, queue_work, args.repeats)
            rows.append({"write": name, "queued": queued, "queued_gpu_ms": busy,
                         "host_ms_median": statistics.median(times), "host_ms_max": max(times)})
    result = {
        "benchmark": "host wait of one device-table write behind a busy stream",
        "command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": git_commit(args.commit),
        "busy_ms": args.busy_ms, "products_queued": products, "repeats": args.repeats, "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{result['gpu']}, torch {torch.__version__}, {args.busy_ms:g} ms of work queued before each write")
    for r in rows:
        print(f"{r['write']:20} behind {r['queued']:13} ({r['queued_gpu_ms']:6.2f} ms) host {r['host_ms_median']:8.3f} ms median "
              f"{r['host_ms_max']:8.3f} ms max")
    return 0


if __name__ == "__main__":
    sys.exit(main())
