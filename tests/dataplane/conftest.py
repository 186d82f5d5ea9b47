"""Fixtures of the dataplane tests: one small random checkpoint per session
(written by tools/make_random_checkpoint.py) and a factory of started engines
that are stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import triton

from dataplane.config import DataplaneConfig
from dataplane.engine import Engine
from dataplane.engine_builder import build_engine
from tools.make_random_checkpoint import make_random_checkpoint

# Small pool: a few hundred blocks is plenty for these tests and quick to allocate.
TEST_ARENA_BYTES = 8 << 20
# On a GPU an engine without a budget takes this fraction of the free memory
# (the default 0.9 let the first engine of a test leave none for the next:
# "no memory left for even one KV block" on an H100, session 40).
TEST_GPU_MEMORY_FRACTION = 0.05

# How far one token's log-probability may move between two correct paths of the engine (batched
# or alone, graph or eager, cached or recomputed K/V, against a float32 peer), by the dtype the
# engine computes in. float32 paths agree to rounding. bf16 (the "auto" dtype on a GPU) keeps 8
# bits of mantissa, so logits of a few units round by ~1e-2 differently on each path; the H200
# showed up to 4e-3 on these tests (session 38).
LOGPROB_ATOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@pytest.fixture(scope="session")
def random_ckpt(tmp_path_factory) -> Path:
    return make_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "pw-random")


@pytest.fixture
def logprob_atol(random_ckpt) -> float:
    """LOGPROB_ATOL at the dtype `make_engine`'s engines compute in."""
    return LOGPROB_ATOL[DataplaneConfig(model_path=str(random_ckpt)).resolved_dtype()]


@pytest.fixture
def make_engine(random_ckpt) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(reclaim_pages=None, **overrides) -> Engine:
        # Dense experts: these tests are about the engine's mechanics; paged
        # experts have their own tests (tests/dataplane/test_dp_precision.py).
        fields = {
            "model_path": str(random_ckpt),
            "cpu_arena_bytes": TEST_ARENA_BYTES,
            "gpu_memory_utilization": TEST_GPU_MEMORY_FRACTION,
            "expert_precision": "dense",
            **overrides,
        }
        engine = build_engine(DataplaneConfig(**fields), reclaim_pages=reclaim_pages)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def no_hook():
    """Triton's jit_cache_hook cleared for the test and restored after it
    (tests of dataplane/kernel_compiles.py's watch call the hook by hand)."""
    before = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = None
    yield
    triton.knobs.runtime.jit_cache_hook = before
