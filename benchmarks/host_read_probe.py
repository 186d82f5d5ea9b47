"""Probe (GPU): can a Triton kernel read expert weights straight from pinned host memory?

    python benchmarks/host_read_probe.py --out benchmarks/results/host_read_probe_h100.json

Why (session 53): a host-only block was then fetched into arena pages for each use, which forced
every step off its CUDA graph; on the H100 that made the default model's decode 11-20x slower
(benchmarks/results/host_only_cost_*_h100_s53.json), far more than the fetches themselves. (Since
session 54 the MoE kernels read host-only blocks in place, as this probe proposed.)
A kernel that read such a block over PCIe in place (zero-copy: pinned memory is mapped into the
device's address space) would keep the graphs and pay only the bytes. This measures the premise:

* a Triton kernel given a pinned CPU tensor (Triton passes its mapped device address) sums it
  exactly as the same kernel over a device copy;
* the read bandwidth from pinned host memory against device memory, by buffer size (one block of
  the default model at 8 bits is 114 KB; a Mixtral-8x7B block 59 MB);
* the same launch captured in a CUDA graph and replayed, reading host memory written after the
  capture (what a graph replay would see of a block's current host copy).

Prints a short table last; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.provenance import git_commit  # noqa: E402

BLOCK = 4096  # int32 words per program
SIZES = (114 * 1024, 1 << 20, 8 << 20, 64 << 20)  # bytes


@triton.jit
def _sum_words_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[pid] = sum of the int32 words [pid * BLOCK, +BLOCK) of src (int64 accumulation)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(src_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(words.to(tl.int64), axis=0))


def sum_words(src: torch.Tensor, out: torch.Tensor) -> None:
    """src int32 [n] on the GPU or pinned on the host; out int64 [cdiv(n, BLOCK)] on the GPU."""
    if src.dtype != torch.int32 or src.dim() != 1:
        raise ValueError("src must be int32 [n]")
    if not (src.is_cuda or src.is_pinned()):
        raise ValueError("src must be on the GPU or in pinned host memory")
    if out.shape != (triton.cdiv(src.numel(), BLOCK),) or out.dtype != torch.int64 or not out.is_cuda:
        raise ValueError("out must be int64 [cdiv(n, BLOCK)] on the GPU")
    _sum_words_kernel[(out.numel(),)](src, out, src.numel(), BLOCK=BLOCK)


def timed_us(fn, reps: int = 20) -> float:
    """Median microseconds of fn over reps CUDA-event timings."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return sorted(times)[len(times) // 2]


def probe_size(nbytes: int) -> dict:
    n = nbytes // 4
    host = torch.randint(-(1 << 30), 1 << 30, (n,), dtype=torch.int32).pin_memory()  # [n]
    dev = host.to("cuda")  # [n]
    out_host, out_dev = (torch.empty(triton.cdiv(n, BLOCK), dtype=torch.int64, device="cuda") for _ in range(2))
    row: dict = {"bytes": nbytes}
    try:
        sum_words(host, out_host)
        sum_words(dev, out_dev)
        torch.cuda.synchronize()
        row["exact"] = bool(torch.equal(out_host, out_dev))
    except Exception as exc:  # the premise fails here: recorded, not fatal
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return row
    row["device_us"] = timed_us(lambda: sum_words(dev, out_dev))
    row["host_us"] = timed_us(lambda: sum_words(host, out_host))
    row["device_GBps"] = nbytes / row["device_us"] / 1e3
    row["host_GBps"] = nbytes / row["host_us"] / 1e3
    row["copy_then_read_us"] = timed_us(lambda: (dev.copy_(host, non_blocking=True), sum_words(dev, out_dev)))
    # Captured once, replayed after the host copy changed: the replay must read the new bytes.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sum_words(host, out_host)
    host.add_(1)
    graph.replay()
    dev.copy_(host)
    sum_words(dev, out_dev)
    torch.cuda.synchronize()
    row["graph_replay_reads_current_host_bytes"] = bool(torch.equal(out_host, out_dev))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    rows = [probe_size(s) for s in SIZES]
    result = {"benchmark": "host read probe",
              "command": " ".join(["benchmarks/host_read_probe.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "commit": git_commit(args.commit), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'bytes':>10} {'exact':>6} {'dev us':>8} {'host us':>9} {'dev GB/s':>9} {'host GB/s':>10} "
          f"{'copy+read us':>13} {'graph':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['bytes']:10d} error: {r['error']}")
            continue
        print(f"{r['bytes']:10d} {str(r['exact']):>6} {r['device_us']:8.1f} {r['host_us']:9.1f} "
              f"{r['device_GBps']:9.1f} {r['host_GBps']:10.1f} {r['copy_then_read_us']:13.1f} "
              f"{str(r['graph_replay_reads_current_host_bytes']):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
