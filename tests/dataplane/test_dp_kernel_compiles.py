"""Triton kernel variants compiled while serving (dataplane/kernel_compiles.py):
counted through Triton's jit_cache_hook, published in EngineStats (gRPC
included), zeroed after the warm-up, logged as a warning once serving. Triton's
calls of the hook are made here by hand: the CPU interpreter compiles nothing."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import grpc
import pytest
import triton

from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.engine_io import QueueSink
from dataplane.kernel_compiles import CompileWatch
from dataplane.sampling_params import SamplingParams
from dataplane.warmup import warm_up as real_warm_up
from pagedweight.v1 import inference_pb2, inference_pb2_grpc

TIMEOUT_S = 120


def triton_compiles(kernel: str):
    """What Triton does before it compiles a variant of ``kernel``."""
    hook = triton.knobs.runtime.jit_cache_hook
    return hook(key="k", repr=f"{kernel}[num_warps=4](T: i32, x_ptr: *fp32)", fn=SimpleNamespace(name=kernel),
                compile={}, is_manual_warmup=False,
                already_compiled=False) if hook is not None else None


def test_watch_counts_chains_and_restores(no_hook) -> None:
    chained: list[str] = []

    def earlier(**kwargs):
        chained.append(kwargs["fn"].name)
        return False

    triton.knobs.runtime.jit_cache_hook = earlier
    seen: list[str] = []
    watch = CompileWatch(seen.append)
    assert watch.install()
    assert triton_compiles("_moe_prep_kernel") is False  # Triton goes on and compiles
    assert seen == ["_moe_prep_kernel"] and chained == ["_moe_prep_kernel"]
    watch.uninstall()
    assert triton.knobs.runtime.jit_cache_hook is earlier
    triton_compiles("_decode_kernel")
    assert seen == ["_moe_prep_kernel"]


def test_uninstall_under_a_later_hook_only_stops_counting(no_hook) -> None:
    seen: list[str] = []
    watch = CompileWatch(seen.append)
    watch.install()
    ours = triton.knobs.runtime.jit_cache_hook
    later = []
    triton.knobs.runtime.jit_cache_hook = lambda **kw: later.append(1) or ours(**kw)
    watch.uninstall()
    assert triton.knobs.runtime.jit_cache_hook is not ours  # the later hook stays
    triton_compiles("_decode_kernel")
    assert later == [1] and seen == []


def _config(model: str, **overrides) -> DataplaneConfig:
    fields = dict(model_path=model, device="cpu", dtype="float32", cpu_arena_bytes=8 << 20, max_running_seqs=4,
                  max_batched_tokens=64, max_context_length=256, expert_precision="dense")
    return DataplaneConfig(**{**fields, **overrides})


def test_compiles_after_the_warm_up_are_counted_published_and_logged(random_ckpt, monkeypatch, no_hook,
                                                                     caplog) -> None:
    def warm_up_that_compiles(engine, rounds, timeout_s):
        triton_compiles("_moe_gate_up_kernel")  # during the warm-up: expected, zeroed with the counters
        return real_warm_up(engine, rounds, timeout_s)

    monkeypatch.setattr("dataplane.app.warm_up", warm_up_that_compiles)
    dataplane = Dataplane(_config(str(random_ckpt), warm_up=True))
    address = dataplane.start()
    try:
        with caplog.at_level(logging.WARNING, logger="dataplane.kernel_compiles"):
            triton_compiles("_moe_prep_kernel")  # while serving
        # The warning names the variant, so the shape the warm-up missed can be found.
        assert any("_moe_prep_kernel" in r.getMessage() and "while serving" in r.getMessage()
                   and "(T: i32, x_ptr: *fp32)" in r.getMessage() for r in caplog.records)
        sink = QueueSink()  # a step publishes the stats
        dataplane.engine.add_request("after", [5, 6, 7], SamplingParams(max_tokens=2), sink)
        list(sink.outputs(timeout=TIMEOUT_S))
        assert dataplane.engine.stats().kernel_compiles_total == 1
        with grpc.insecure_channel(address) as channel:
            stats = inference_pb2_grpc.InferenceStub(channel).GetEngineStats(
                inference_pb2.GetEngineStatsRequest(), timeout=TIMEOUT_S)
        assert stats.kernel_compiles_total == 1
    finally:
        dataplane.stop()
    assert triton.knobs.runtime.jit_cache_hook is None  # stop restored the knob
