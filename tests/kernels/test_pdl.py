"""Programmatic dependent launch (kernels/pdl.py): off where there is none and
for large launches; on the GPU, a launch that may start early still reads its
inputs only once the launch before it has written them."""

import types

import pytest
import torch

from kernels import moe_mixed
from kernels.paged_attention import kv_cache_view, paged_attention_decode, paged_attention_decode_reference
from kernels.pdl import DEFAULT_PDL, PDL_MAX_ROWS, PDL_MOE_WEIGHT_MAX_ROWS, PdlPolicy, pdl_options


def test_pdl_is_off_on_the_cpu():
    assert pdl_options(torch.device("cpu"), 1) == {"PDL": False}
    assert pdl_options(torch.device("cpu"), 1, PdlPolicy(max_rows=64)) == {"PDL": False}


def test_pdl_policy_is_validated():
    assert DEFAULT_PDL == PdlPolicy(max_rows=PDL_MAX_ROWS, moe_weight_max_rows=PDL_MOE_WEIGHT_MAX_ROWS)
    assert PdlPolicy(max_rows=0).max_rows == 0
    for bad in (-1, 2.5, "16", None):
        with pytest.raises(ValueError):
            PdlPolicy(max_rows=bad)


def test_moe_weight_launches_have_their_own_limit():
    assert DEFAULT_PDL.moe_weights() == PdlPolicy(max_rows=PDL_MOE_WEIGHT_MAX_ROWS)
    one_limit = PdlPolicy(max_rows=64, moe_weight_max_rows=None)
    assert one_limit.moe_weights() is one_limit  # None: the one limit
    # Never above the whole limit: 0 turns every launch's PDL off.
    assert PdlPolicy(max_rows=0).moe_weights() == PdlPolicy(max_rows=0)
    assert PdlPolicy(max_rows=8, moe_weight_max_rows=16).moe_weights().max_rows == 8
    assert PdlPolicy(max_rows=64, moe_weight_max_rows=16).moe_weights() == PdlPolicy(max_rows=16)
    assert PdlPolicy(max_rows=64, moe_weight_max_rows=0).moe_weights() == PdlPolicy(max_rows=0)
    for bad in (-1, 2.5, "16"):
        with pytest.raises(ValueError, match="moe_weight_max_rows"):
            PdlPolicy(moe_weight_max_rows=bad)


@pytest.mark.parametrize("one_launch", [False, True])
def test_the_layer_gives_the_weight_launches_their_policy(monkeypatch, one_launch):
    # kernels/moe_mixed.py's launches 2 and 3 take the weight policy; the
    # caller's (prep or entry) keeps the whole one, and so does the combine
    # launch after an apart gate/up launch (combine_pdl).
    seen = []
    for name in ("run_gate_up", "run_down", "run_gate_up_down"):
        monkeypatch.setattr(moe_mixed, name, lambda *args, name=name, **kw: seen.append(
            (name, args[-1], kw.get("combine_pdl"))))
    policy = PdlPolicy(max_rows=64, moe_weight_max_rows=16)
    moe_mixed._run_projections(None, None, None, 0, 8, 2, 128, types.SimpleNamespace(one_launch=one_launch), 16,
                               policy)
    weights = PdlPolicy(max_rows=16)
    want = ([("run_gate_up_down", weights, None)] if one_launch
            else [("run_gate_up", weights, policy), ("run_down", weights, None)])
    assert seen == want


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
