"""PagedExperts' fused Triton path (kernels/moe_mixed.py) agrees with its
plain-torch path on the same store, with mixed bitwidths in one layer (runs in
Triton's interpreter without a GPU, natively on one)."""

from __future__ import annotations

import pytest
import torch

from dataplane.layers.moe import SparseMoeBlock
from dataplane.layers.norm import RMSNorm
from dataplane.memory.arena import Arena
from dataplane.routing_stats import RoutingStats
from dataplane.weights.codec import encode
from dataplane.weights.layout import NUM_PROJ, block_index
from dataplane.weights.paged_experts import PagedExperts
from dataplane.weights.store import WeightStore
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tuning import MoeTuning

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 128, 256, 4, 2, 7
PAGE_BYTES = 4096
BITS_BY_EXPERT = (8, 2, 4, 3)
REL_TOL = 2e-2  # fp16 operands in the kernel, fp32 in the reference


@pytest.mark.parametrize("tuning", [None, MoeTuning(cuda_core_max_tokens=TOKENS)])
def test_fused_matches_plain_path_with_mixed_bits(tuning):
    # tuning None: the shipped tiles; cuda_core_max_tokens: the one-token
    # (CUDA-core) tile over all 7 tokens, experts of several tokens taking one
    # pass each.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(5)
    shapes = [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    blocks = [encode(torch.randn(*shapes[p], generator=gen) * 0.05) for _ in range(EXPERTS) for p in range(NUM_PROJ)]
    bits = [BITS_BY_EXPERT[e] for e in range(EXPERTS) for _ in range(NUM_PROJ)]
    arena = Arena(256, PAGE_BYTES, device=device)
    arena.storage.fill_(0xFF)  # unwritten bytes read as NaN
    store = WeightStore(arena, blocks, initial_bits=bits)
    assert store.bits(block_index(0, 1, 0, EXPERTS)) == 2
    fused = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=True, cache_decoded=False, moe_tuning=tuning)
    plain = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=False, cache_decoded=False)
    if tuning is not None:
        assert choose_tiles(TOKENS, TOP_K, EXPERTS, HIDDEN, FFN, tuning=tuning).block_m == 1
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(device)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(TOKENS)]).to(device)
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=gen), -1).to(device)
    want = plain(x, ids, weights)
    got = fused(x, ids, weights)
    assert torch.isfinite(got).all()
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < REL_TOL, f"relative error {err:.3g}"


def test_accumulator_out_returns_the_float32_sum_that_rounds_to_the_default():
    # accumulator_out hands the fused kernel's float32 output to a caller that
    # rounds it where it adds it (RMSNorm.add_forward); the default rounds it
    # to x's dtype here. Both must be the same numbers.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(6)
    shapes = [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    blocks = [encode(torch.randn(*shapes[p], generator=gen) * 0.05) for _ in range(EXPERTS) for p in range(NUM_PROJ)]
    store = WeightStore(Arena(256, PAGE_BYTES, device=device), blocks, initial_bits=4)
    rounded = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=True, cache_decoded=False)
    raw = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=True, cache_decoded=False, accumulator_out=True)
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(device, torch.float16)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(TOKENS)]).to(device)
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=gen), -1).to(device)
    a, b = rounded(x, ids, weights), raw(x, ids, weights)
    assert a.dtype == torch.float16 and b.dtype == torch.float32
    if device == "cpu":
        assert torch.equal(b.to(torch.float16), a)
    else:  # the down launch's atomic adds land in a different order per call
        torch.testing.assert_close(b.to(torch.float16), a, rtol=2**-9, atol=1e-5)
    assert not torch.equal(b, a.float())  # the accumulator really is unrounded


def test_moe_block_entry_launch_matches_the_unfused_block():
    # SparseMoeBlock.add_norm_forward: PagedExperts' one entry launch
    # (kernels/moe_entry.py: add, norm, router, prep) against fused_entry=False
    # (norm.add_forward, the router, then the experts), on one store.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16
    gen = torch.Generator().manual_seed(7)
    shapes = [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    blocks = [encode(torch.randn(*shapes[p], generator=gen) * 0.05) for _ in range(EXPERTS) for p in range(NUM_PROJ)]
    store = WeightStore(Arena(256, PAGE_BYTES, device=device), blocks,
                        initial_bits=[BITS_BY_EXPERT[e] for e in range(EXPERTS) for _ in range(NUM_PROJ)])
    norm = RMSNorm(HIDDEN, 1e-5, torch.device(device), dtype)
    norm.weight.data.copy_(1 + 0.1 * torch.randn(HIDDEN, generator=gen))
    # router logits spread by expert, so no near tie decides the top-k
    gate = torch.randn(EXPERTS, HIDDEN, generator=gen) / HIDDEN**0.5 + torch.arange(EXPERTS)[:, None] / HIDDEN
    delta = torch.randn(TOKENS, HIDDEN, generator=gen).to(device, dtype)
    residual = (torch.randn(TOKENS, HIDDEN, generator=gen) * 2).to(device, dtype)
    results = []
    for entry in (True, False):
        moe = SparseMoeBlock(0, HIDDEN, FFN, EXPERTS, TOP_K, torch.device(device), dtype)
        moe.gate.weight.data.copy_(gate)
        moe.experts = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=True, cache_decoded=False,
                                   fused_entry=entry)
        assert moe.experts.entry_ready(TOKENS, TOP_K, moe.gate.weight) == entry
        stats = RoutingStats(1, EXPERTS, torch.arange(TOKENS, device=device) % 2, 2)
        out, res = moe.add_norm_forward(delta, residual, norm, stats)
        results.append((out, res, stats))
    (out, res, stats), (want_out, want_res, want_stats) = results
    assert torch.equal(res, want_res)
    assert torch.equal(stats.routed_tokens, want_stats.routed_tokens)
    assert int(stats.routed_tokens.sum()) == TOKENS * TOP_K
    torch.testing.assert_close(stats.prob_mass, want_stats.prob_mass, rtol=1e-3, atol=1e-3)
    err = (out.float() - want_out.float()).norm() / want_out.float().norm()
    assert err < 1e-2, f"relative error {err:.3g}"


def test_fused_reads_host_only_blocks_in_place_at_the_master_view():
    # Experts 1 and 3 host-only: the kernels follow their page-table rows to
    # the master on the host (pinned and mapped on a GPU; plain host memory in
    # the interpreter) and must compute what the same blocks resident at
    # 8 bits give, with no arena page held for them.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(8)
    shapes = [(FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    blocks = [encode(torch.randn(*shapes[p], generator=gen) * 0.05) for _ in range(EXPERTS) for p in range(NUM_PROJ)]
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(device)
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(TOKENS)]).to(device)
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=gen), -1).to(device)
    outputs = []
    for host_bits in (0, 8):
        bits = [host_bits if e in (1, 3) else BITS_BY_EXPERT[e] for e in range(EXPERTS) for _ in range(NUM_PROJ)]
        arena = Arena(256, PAGE_BYTES, device=device)
        arena.storage.fill_(0xFF)  # unwritten bytes read as NaN
        store = WeightStore(arena, blocks, initial_bits=bits)
        fused = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=True, cache_decoded=False)
        outputs.append(fused(x, ids, weights))
        if host_bits == 0:
            assert len(store.host_only_set()) == 2 * NUM_PROJ and {1, 3} <= set(ids.flatten().tolist())
            assert arena.free_pages == arena.num_pages - sum(store.block_pages(b, x) for b, x in enumerate(bits))
            plain = PagedExperts(store, 0, EXPERTS, HIDDEN, FFN, fused_kernel=False, cache_decoded=False)
            want = plain(x, ids, weights)
            err = (outputs[0].float() - want.float()).norm() / want.float().norm()
            assert err < REL_TOL, f"relative error {err:.3g}"
    on_host, resident = outputs
    assert torch.isfinite(on_host).all()
    if device == "cpu":
        assert torch.equal(on_host, resident)
    else:  # the down launch's atomic adds land in a different order per call
        torch.testing.assert_close(on_host, resident, rtol=1e-3, atol=1e-5)
