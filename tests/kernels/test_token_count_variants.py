"""Kernels launched at every step's token count compile no variant per count.

Triton specializes an int argument that equals 1 or is divisible by 16. A
prefill or mixed step whose token count is not a multiple of 16 used to
compile its own variant of the MoE prep and entry launches, live, in the
middle of serving (2.7 s in benchmarks/memory_pressure.py's burst; NOTES,
session 43). After one launch of a token-count class (the same constexprs: the
start-up warm-up's rounds, dataplane/warmup.py), other counts of that class
must reuse the compiled kernel. The same for the decode attention of an
eager step, whose block-table width varies with its longest context. GPU
only: the interpreter compiles nothing.
"""

from contextlib import contextmanager

import pytest
import torch

from dataplane.kernel_compiles import CompileWatch
from dataplane.memory.arena import Arena
from kernels import weight_layout as wl
from kernels.arrival_counters import ArrivalCounters
from kernels.moe_align import alloc_prep, moe_prepare, moe_prepare_reference
from kernels.moe_entry import moe_entry, moe_entry_suits
from kernels.paged_attention import kv_cache_view, paged_attention_decode, paged_attention_decode_reference

EXPERTS, TOP_K, GROUPS = 8, 2, 6
HIDDEN = GROUPS * wl.GROUP


@contextmanager
def compiled_names():
    """Names of the kernels that miss Triton's in-memory cache (compile or
    load a variant) inside the block (dataplane/kernel_compiles.py)."""
    names: list[str] = []
    watch = CompileWatch(names.append)
    assert watch.install()
    try:
        yield names
    finally:
        watch.uninstall()


def _prepare(t: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, HIDDEN, generator=gen).to(torch.float16).cuda()
    ids = torch.randint(0, EXPERTS, (t, TOP_K), generator=gen).cuda()
    prep = moe_prepare(x, ids, EXPERTS, alloc_prep(t, TOP_K, HIDDEN, EXPERTS, x.device))
    return x, ids, prep


@pytest.mark.gpu
@pytest.mark.parametrize("first,others", [
    (512, [281, 300, 509]),  # pairs 513-1024: sorted in the kernel
    (1024, [513, 777]),  # sorted by torch after the launch
])
def test_prep_reuses_one_variant_per_token_class(first, others):
    _prepare(first, seed=0)
    with compiled_names() as names:
        for t in others:
            x, ids, prep = _prepare(t, seed=t)
            want = moe_prepare_reference(x, ids, EXPERTS)
            assert torch.equal(prep.offsets.cpu(), want.offsets.cpu())
            assert torch.equal(prep.sorted_ids.cpu(), want.sorted_ids.cpu())
    assert "_moe_prep_kernel" not in names


@pytest.mark.gpu
@pytest.mark.parametrize("first,others", [(256, [150, 129, 255]), (16, [9, 13]), (1, [])])
def test_entry_reuses_one_variant_per_token_class(first, others):
    gen = torch.Generator().manual_seed(first)
    w = (torch.randn(EXPERTS, HIDDEN, generator=gen) / HIDDEN**0.5).to(torch.float16).cuda()
    norm_w = torch.ones(HIDDEN, dtype=torch.float16, device="cuda")
    counters = ArrivalCounters()

    def run(t: int):
        assert moe_entry_suits(t, TOP_K, w)
        delta, residual = (torch.randn(t, HIDDEN, generator=gen).to(torch.float16).cuda() for _ in range(2))
        prep = alloc_prep(t, TOP_K, HIDDEN, EXPERTS, delta.device)
        _, ids, _ = moe_entry(delta, residual, norm_w, 1e-5, w, TOP_K, prep, counters)
        want = moe_prepare_reference(delta.float(), ids, EXPERTS)  # the sort of the routed ids
        assert torch.equal(prep.offsets.cpu(), want.offsets.cpu())
        assert torch.equal(prep.sorted_ids[: t * TOP_K].cpu(), want.sorted_ids.cpu())
        assert counters.all_zero()

    run(first)
    with compiled_names() as names:
        for t in others:
            run(t)
        run(first)
    assert "_moe_entry_kernel" not in names


@pytest.mark.gpu
def test_eager_decode_attention_reuses_one_variant_per_batch_size():
    # An eager decode step (a host-only block forbids the graphs) passes its
    # batch's block-table width: each width once compiled a variant.
    layers, bs, kvh, dim, seqs = 2, 16, 2, 64, 3
    arena = Arena(64, layers * 2 * bs * kvh * dim * 2, device="cuda")
    cache = kv_cache_view(arena.storage, layers, bs, kvh, dim, torch.float16)
    cache.copy_(torch.randn(cache.shape, dtype=torch.float16))
    q = torch.randn(seqs, 8, dim, dtype=torch.float16, device="cuda")

    def run(width: int):
        table = torch.randint(0, 64, (seqs, width), dtype=torch.int32, device="cuda")
        lens = torch.tensor([width * bs, width * bs - 5, 1], dtype=torch.int32, device="cuda")
        out = paged_attention_decode(q, cache, 1, table, lens)
        want = paged_attention_decode_reference(q, cache, 1, table, lens)
        assert torch.allclose(out.float(), want.float(), atol=2e-3, rtol=2e-2)

    run(16)
    with compiled_names() as names:
        for width in (1, 3, 17, 33):
            run(width)
    assert "_decode_kernel" not in names and "_decode_merge_kernel" not in names
