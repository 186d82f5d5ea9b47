"""Paged decode attention, KV writes and prefill attention against torch."""

import pytest
import torch

from dataplane.memory.arena import KV_TAG, Arena
from kernels.paged_attention import (
    default_partitions,
    kv_cache_view,
    paged_attention_decode,
    paged_attention_decode_reference,
    prefill_attention,
    prefill_attention_reference,
    target_programs,
    write_kv_cache,
)

LAYERS, BS, KVH, D = 3, 16, 2, 32
DTYPE = torch.float16


def make_cache(device, pages):
    page_bytes = LAYERS * 2 * BS * KVH * D * 2
    arena = Arena(pages, page_bytes, device=device)
    return arena, kv_cache_view(arena.storage, LAYERS, BS, KVH, D, DTYPE)


@pytest.mark.parametrize("partitions", [1, 3, 8])  # 8: more splits than the longest context's 4 blocks
def test_decode_over_scattered_pages(device, partitions):
    torch.manual_seed(11)
    arena, cache = make_cache(device, 24)
    cache.copy_(torch.randn(cache.shape, dtype=DTYPE))
    lens = torch.tensor([37, 1, 0, 64], dtype=torch.int32)
    pages = arena.alloc(16, KV_TAG)
    order = torch.randperm(16).tolist()
    table = torch.full((4, 5), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(lens.tolist()):
        nb = -(-n // BS)
        table[s, :nb] = torch.tensor([pages[order[used + i]] for i in range(nb)], dtype=torch.int32)
        used += nb
    table = table.clamp(min=0)  # entries past a sequence's end are never read
    q = torch.randn(4, 8, D, dtype=DTYPE)  # 8 query heads on 2 kv heads
    out = torch.full((4, 8, D), float("nan"), dtype=DTYPE, device=device)
    paged_attention_decode(q.to(device), cache, 1, table.to(device), lens.to(device),
                           num_partitions=partitions, out=out)
    ref = paged_attention_decode_reference(q.to(device), cache, 1, table.to(device), lens.to(device))
    assert bool(torch.isfinite(out).all())
    assert torch.allclose(out.float().cpu(), ref.cpu(), atol=2e-3, rtol=2e-2)


def test_default_partitions_depend_on_the_batch_alone():
    # Powers of two filling the target programs: every value an eager step can take is one a
    # decode graph bucket (1, 2, 4, 8, 16, ...) compiles too.
    h200 = 2 * 132  # target_programs on an H100 or H200
    assert [default_partitions(s, 8, h200) for s in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)] == \
        [32, 16, 8, 8, 4, 4, 2, 2, 1, 1, 1]
    assert default_partitions(1, 2, h200) == 128 and default_partitions(1, h200 + 1, h200) == 1
    assert target_programs(torch.device("cpu")) == 1


def test_decode_ignores_stale_nan_slots(device):
    """Slots past a sequence's length may hold anything (a page that held expert
    weights before a demotion): the result must not see them, NaN included."""
    torch.manual_seed(5)
    arena, cache = make_cache(device, 8)
    cache.copy_(torch.randn(cache.shape, dtype=DTYPE))
    lens = torch.tensor([21, 9], dtype=torch.int32)  # both end inside a block
    pages = arena.alloc(3, KV_TAG)
    table = torch.tensor([[pages[0], pages[1]], [pages[2], 0]], dtype=torch.int32)
    q = torch.randn(2, 8, D, dtype=DTYPE).to(device)
    ref = paged_attention_decode_reference(q, cache, 1, table.to(device), lens.to(device))
    cache[pages[1], :, :, 21 - BS:] = float("nan")  # the tails of both last blocks
    cache[pages[2], :, :, 9:] = float("nan")
    out = paged_attention_decode(q, cache, 1, table.to(device), lens.to(device), num_partitions=1)
    assert bool(torch.isfinite(out).all())
    assert torch.allclose(out.float().cpu(), ref.float().cpu(), atol=2e-3, rtol=2e-2)


def test_write_kv_cache_places_tokens(device):
    torch.manual_seed(12)
    _, cache = make_cache(device, 4)
    cache.fill_(float("nan"))
    k = torch.randn(5, KVH, D, dtype=DTYPE)
    v = torch.randn(5, KVH, D, dtype=DTYPE)
    slots = torch.tensor([0, 17, 63, -1, 5])
    write_kv_cache(k.to(device), v.to(device), cache, 2, slots.to(device))
    c = cache.cpu()
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        assert torch.equal(c[slot // BS, 2, 0, slot % BS], k[i])
        assert torch.equal(c[slot // BS, 2, 1, slot % BS], v[i])
    assert bool(torch.isnan(c[:, 1]).all())  # other layers untouched


def test_prefill_causal_varlen_gqa(device):
    torch.manual_seed(13)
    cu = torch.tensor([0, 5, 24, 24, 41], dtype=torch.int32)
    t = int(cu[-1])
    q = torch.randn(t, 4, D, dtype=DTYPE)
    k = torch.randn(t, 2, D, dtype=DTYPE)
    v = torch.randn(t, 2, D, dtype=DTYPE)
    out = torch.full(q.shape, float("nan"), dtype=DTYPE, device=device)
    prefill_attention(q.to(device), k.to(device), v.to(device), cu.to(device), 19, block=16, out=out)
    assert bool(torch.isfinite(out).all())
    ref = prefill_attention_reference(q, k, v, cu)
    assert torch.allclose(out.float().cpu(), ref, atol=2e-3, rtol=2e-2)


def test_decode_rejects_bad_inputs(device):
    _, cache = make_cache(device, 2)
    q = torch.randn(1, 3, D, dtype=DTYPE, device=device)  # 3 heads on 2 kv heads
    with pytest.raises(ValueError):
        paged_attention_decode(q, cache, 0, torch.zeros(1, 1, dtype=torch.int32, device=device),
                               torch.ones(1, dtype=torch.int32, device=device))
