"""After the start-up warm-up, no step compiles a Triton kernel variant.

Traffic unlike the warm-up's (prompt lengths and batch sizes off the powers
of two, prefill chunks beside decodes, then steps at odd token counts while
some expert blocks are host-only) runs through a served dataplane; the live compiles it
counts (dataplane/kernel_compiles.py) must stay at zero. On the GPU this is
the coverage the warm-up promises (a live compile stalled a Mixtral burst
2.7 s; benchmarks/NOTES.md, session 43; when host-only blocks were fetched
by an eager path of their own, its first step compiled a router and a prep
variant on the H100, session 44: the kernels now read them in place, in the
same launches). On the CPU nothing compiles, so there it checks the
traffic itself: every request ends and each host-only batch read blocks
from the host.
"""

from __future__ import annotations

import random

import pytest
import torch

from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams
from dataplane.sequence import FinishReason

TIMEOUT_S = 300
MAX_RUNNING = 12  # buckets 1, 2, 4, 8, 12
PROMPT_LENGTHS = (3, 23, 57, 130, 201, 17, 250, 99, 5, 161, 41, 77, 9, 188)
HOST_ONLY_EVERY = 5  # every fifth expert block host-only in the second phase
# Second phase: the first steps of these batches run while blocks are host-only (3, 14, 40, 130, 175
# and 256 tokens with max_batched_tokens 256).
HOST_ONLY_BATCHES = ((3,), (5, 9), (23, 17), (130,), (57, 41, 77), (250, 99))


def _serve(dataplane: Dataplane, tag: str, lengths: tuple[int, ...], seed: int) -> None:
    rng = random.Random(seed)
    vocab = dataplane.engine.model_info.vocab_size
    sinks = []
    for i, n in enumerate(lengths):
        sink = QueueSink()
        prompt = [rng.randrange(2, vocab) for _ in range(n)]
        sampling = SamplingParams(max_tokens=rng.randint(2, 9), ignore_eos=True)
        dataplane.engine.add_request(f"{tag}{i}", prompt, sampling, sink)
        sinks.append(sink)
    for sink in sinks:
        assert list(sink.outputs(timeout=TIMEOUT_S))[-1].finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu), "cpu"])
def test_no_kernel_compiles_after_the_warm_up(device) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    config = DataplaneConfig(synthetic="mixtral-tiny", device=device, dtype="float32", warm_up=True,
                             max_running_seqs=MAX_RUNNING, max_batched_tokens=256, max_context_length=512,
                             max_arena_pages=512, expert_precision="paged")
    dataplane = Dataplane(config)
    dataplane.start()
    try:
        _serve(dataplane, "mixed", PROMPT_LENGTHS, seed=1)
        store = dataplane.controller.store
        engine = dataplane.engine
        for i, lengths in enumerate(HOST_ONLY_BATCHES):
            # Each batch runs while blocks are host-only (the precision
            # controller may promote them back as it goes).
            read = store.counters.host_reads
            engine.run_on_engine_thread(
                lambda: [store.set_host_only(b) for b in range(0, store.num_blocks, HOST_ONLY_EVERY)])
            _serve(dataplane, f"host-only{i}-", lengths, seed=2 + i)
            assert store.counters.host_reads > read
        assert engine.stats().kernel_compiles_total == 0
    finally:
        dataplane.stop()
