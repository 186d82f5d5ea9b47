"""Programmatic dependent launch (kernels/pdl.py): off where there is none and
for large launches; on the GPU, a launch that may start early still reads its
inputs only once the launch before it has written them."""

import pytest
import torch

from kernels.paged_attention import kv_cache_view, paged_attention_decode, paged_attention_decode_reference
from kernels.pdl import DEFAULT_PDL, PDL_MAX_ROWS, PdlPolicy, pdl_options


def test_pdl_is_off_on_the_cpu():
    assert pdl_options(torch.device("cpu"), 1) == {"PDL": False}
    assert pdl_options(torch.device("cpu"), 1, PdlPolicy(max_rows=64)) == {"PDL": False}


def test_pdl_policy_is_validated():
    assert DEFAULT_PDL == PdlPolicy(max_rows=PDL_MAX_ROWS)
    assert PdlPolicy(max_rows=0).max_rows == 0
    for bad in (-1, 2.5, "16", None):
        with pytest.raises(ValueError):
            PdlPolicy(max_rows=bad)


@pytest.mark.gpu
def test_gpu_pdl_only_for_small_launches():
    cuda = torch.device("cuda")
    assert pdl_options(cuda, PDL_MAX_ROWS) == {"PDL": True, "launch_pdl": True}
    assert pdl_options(cuda, PDL_MAX_ROWS + 1) == {"PDL": False}
    assert pdl_options(cuda, 4, PdlPolicy(max_rows=4)) == {"PDL": True, "launch_pdl": True}
    assert pdl_options(cuda, 5, PdlPolicy(max_rows=4)) == {"PDL": False}
    assert pdl_options(cuda, 1, PdlPolicy(max_rows=0)) == {"PDL": False}


@pytest.mark.gpu
def test_gpu_merge_reads_the_partitions_only_once_written():
    # One wave of decode programs over long contexts, then the merge of their
    # partitions. The decode grid lets the next launch begin first thing, so
    # the merge's programs are resident while it runs; only the wait at the
    # merge's start keeps them from reading partitions not yet written (the
    # partial buffers come from the caching allocator, over NaN left there).
    torch.manual_seed(0)
    s, nh, kvh, d, bs, ctx = 2, 32, 8, 128, 16, 16384
    blocks = ctx // bs
    storage = torch.empty(s * blocks, 2 * bs * kvh * d * 2, dtype=torch.uint8, device="cuda")
    cache = kv_cache_view(storage, 1, bs, kvh, d, torch.bfloat16)
    cache.normal_()
    table = torch.randperm(s * blocks, device="cuda").to(torch.int32).view(s, blocks)
    lens = torch.tensor([ctx, ctx - 5], dtype=torch.int32, device="cuda")
    q = torch.randn(s, nh, d, device="cuda", dtype=torch.bfloat16)
    ref = paged_attention_decode_reference(q, cache, 0, table, lens)
    for _ in range(3):
        torch.empty(64 * 2**20, dtype=torch.float32, device="cuda").fill_(float("nan"))
        out = paged_attention_decode(q, cache, 0, table, lens)  # 264 / 16 = 16 partitions per (seq, kv head)
        torch.cuda.synchronize()
        assert bool(torch.isfinite(out).all())
        assert torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
