"""Timing of GPU work over CUDA-graph replays, and the copy bandwidth the
benchmarks' percentages are taken against (bench_moe.py, bench_access.py,
the probes).

A replay runs the work once per weight copy, the copies rotated so that the
bytes read are several times the L2: what is timed is the read from HBM, not
from the cache."""

from __future__ import annotations

import torch
import triton
import triton.testing

L2_BYTES = 60 * 2**20  # the H100's and the H200's L2
ROTATE_TARGET = 2 * L2_BYTES  # do_bench also flushes the L2 before every replay
MAX_ROTATIONS = 8


def bench_graph(fn, reps: int) -> float:
    """Median ms of one fn() call, from graph replays of reps back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(i)
    ms = triton.testing.do_bench(graph.replay, warmup=50, rep=300, return_mode="median")
    return ms / reps


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, bytes read + written counted."""
    n = 2**30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * n / ms / 1e6  # GB/s, read + write
