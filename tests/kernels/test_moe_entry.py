"""The MoE entry launch (kernels/moe_entry.py) against the three launches it
replaces and against plain torch."""

import pytest
import torch

from dataplane.routing_stats import RoutingStats
from kernels import weight_layout as wl
from kernels.arrival_counters import ArrivalCounters
from kernels.moe_align import alloc_prep, moe_prepare
from kernels.moe_entry import moe_entry, moe_entry_reference, moe_entry_suits
from kernels.rmsnorm import add_rmsnorm
from kernels.router import gate_route

EPS = 1e-5


def _inputs(t, h, e, dtype, seed):
    """delta, residual [T, H], norm weight [H], router W [E, H]: logits of
    spread ~1 around per-expert offsets (as test_router's), so no near tie
    decides the top-k."""
    g = torch.Generator().manual_seed(seed)
    residual = (torch.randn(t, h, generator=g) * 2).to(dtype)
    delta = torch.randn(t, h, generator=g).to(dtype)
    norm_w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    offset = torch.randperm(e, generator=g).float() * 3 / e
    w = torch.randn(e, h, generator=g) / h**0.5 + offset[:, None] / h
    return delta, residual, norm_w, w.to(dtype)


def _fresh_prep(t, k, h, e, device, plane_dtype, narrow=False):
    prep = alloc_prep(t, k, h, e, device, plane_dtype, narrow)
    for buf in (prep.xsum, prep.out, prep.xq_scale):
        buf.fill_(float("nan"))  # every element must be written
    prep.x_planes.fill_(float("nan") if plane_dtype == torch.float16 else -(2**15))
    for buf in (prep.sorted_ids, prep.offsets, prep.active, prep.num_active):
        buf.fill_(-7)
    return prep


def _assert_same_prep(got, want, pairs):
    assert torch.equal(got.out.cpu(), want.out.cpu())
    assert torch.equal(got.x_planes.cpu(), want.x_planes.cpu())
    assert torch.equal(got.xq_scale.cpu(), want.xq_scale.cpu())
    assert torch.equal(got.xsum.cpu(), want.xsum.cpu())
    assert torch.equal(got.offsets.cpu(), want.offsets.cpu())
    assert torch.equal(got.sorted_ids[:pairs].cpu(), want.sorted_ids[:pairs].cpu())
    n = int(want.num_active)
    assert int(got.num_active) == n and torch.equal(got.active[:n].cpu(), want.active[:n].cpu())


# H: 11 groups = a full chunk of 8 and a partial one; 20 groups = 8 + 8 + 4; 6 groups = one chunk
# record: routing statistics, "weighted" with token weights (the last row padding, weight 0)
# narrow: the fp16 planes in the 8-token tile's slot order
@pytest.mark.parametrize("t,groups,e,k,plane_dtype,with_cost,record,narrow", [
    (2, 6, 8, 2, torch.int16, False, True, False),
    (5, 11, 6, 2, torch.float16, False, "weighted", False),
    (5, 11, 6, 2, torch.int16, True, False, False),
    (1, 20, 8, 2, torch.int16, True, True, False),
    (1, 6, 16, 4, torch.int16, True, "weighted", False),
    (3, 20, 16, 4, torch.float16, True, True, False),
    (5, 11, 6, 2, torch.float16, True, True, True),
])
def test_entry_matches_the_three_launches(device, t, groups, e, k, plane_dtype, with_cost, record, narrow):
    h = groups * wl.GROUP
    dtype = torch.float16
    delta, residual, norm_w, w = (a.to(device) for a in _inputs(t, h, e, dtype, seed=t * groups + e))
    cost = (torch.arange(e, dtype=torch.int32, device=device) * 7) % 3 if with_cost else None
    seq = (torch.arange(t) % 2).to(device)
    token_weight = None
    if record == "weighted":
        token_weight = torch.ones(t, dtype=torch.int64, device=device)
        token_weight[-1] = 0
    stats = [RoutingStats(2, e, seq, 2, token_weight) for _ in range(2)]
    # unfused: add_rmsnorm -> gate_route -> moe_prepare
    want_res, y = add_rmsnorm(delta, residual, norm_w, EPS)
    want_ids, want_w = gate_route(y, w, k, stats[0].targets(1) if record else None)
    want_prep = moe_prepare(y, want_ids, e, _fresh_prep(t, k, h, e, device, plane_dtype, narrow), cost)
    counters = ArrivalCounters()
    prep = _fresh_prep(t, k, h, e, device, plane_dtype, narrow)
    res, ids, weights = moe_entry(delta, residual, norm_w, EPS, w, k, prep, counters,
                                  stats[1].targets(1) if record else None, cost)
    assert torch.equal(res.cpu(), want_res.cpu())
    assert torch.equal(ids.cpu(), want_ids.cpu())
    torch.testing.assert_close(weights.cpu(), want_w.cpu(), rtol=1e-5, atol=1e-6)
    _assert_same_prep(prep, want_prep, t * k)
    assert torch.equal(stats[1].routed_tokens.cpu(), stats[0].routed_tokens.cpu())
    torch.testing.assert_close(stats[1].seq_prob_sum.cpu(), stats[0].seq_prob_sum.cpu(), rtol=1e-5, atol=1e-6)
    if record:
        counted_rows = t if token_weight is None else int(token_weight.sum())
        assert int(stats[1].routed_tokens.sum()) == counted_rows * k
    assert counters.all_zero()  # borrowed counters handed back zeroed
    # a second call on the same counters (a graph replay, the next layer) routes alike
    res2, ids2, _ = moe_entry(delta, residual, norm_w, EPS, w, k, _fresh_prep(t, k, h, e, device, plane_dtype),
                              counters, None, cost)
    assert torch.equal(ids2.cpu(), ids.cpu()) and torch.equal(res2.cpu(), res.cpu()) and counters.all_zero()


@pytest.mark.parametrize("narrow", [False, True])
def test_entry_matches_plain_torch_in_float32(device, narrow):
    # narrow: the planes in the 8-token tile's slot order (MoePrep.narrow_order).
    t, h, e, k = 4, 9 * wl.GROUP, 5, 2
    delta, residual, norm_w, w = _inputs(t, h, e, torch.float32, seed=3)
    delta = delta.to(torch.float32)
    ref_res, _, ref_ids, ref_w, ref_prep = moe_entry_reference(delta, residual, norm_w, EPS, w, k,
                                                               narrow_order=narrow)
    prep = _fresh_prep(t, k, h, e, device, torch.float16, narrow)
    res, ids, weights = moe_entry(delta.to(device), residual.to(device), norm_w.to(device), EPS, w.to(device), k,
                                  prep, ArrivalCounters())
    torch.testing.assert_close(res.cpu(), ref_res)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(weights.cpu(), ref_w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(prep.x_planes.cpu().float(), ref_prep.x_planes.float(), rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(prep.xsum.cpu(), ref_prep.xsum, rtol=1e-3, atol=1e-3)
    assert torch.equal(prep.offsets.cpu(), ref_prep.offsets)
    assert bool((prep.out == 0).all())


def test_entry_suits_and_bad_input(device):
    h, e = 4 * wl.GROUP, 8
    delta, residual, norm_w, w = (a.to(device) for a in _inputs(2, h, e, torch.float16, seed=1))
    assert moe_entry_suits(2, 2, w) and moe_entry_suits(256, 2, w)
    assert not moe_entry_suits(257, 2, w)  # beyond gate_route's tokens
    assert not moe_entry_suits(2, 2, torch.empty(32, h, dtype=torch.float16))  # a router chunk over the tile
    assert not moe_entry_suits(2, 2, torch.empty(8, 200, dtype=torch.float16))  # H not whole groups
    prep = alloc_prep(2, 2, h, e, device, torch.float16)
    counters = ArrivalCounters()
    for args, message in [
        ((delta[0], residual, norm_w, EPS, w, 2, prep), r"\[T, H\]"),
        ((delta.double(), residual, norm_w, EPS, w, 2, prep), "delta must be"),
        ((delta, residual, norm_w[:-1], EPS, w, 2, prep), "norm_weight"),
        ((delta, residual, norm_w, EPS, w.float(), 2, prep), "gate_weight"),
        ((delta, residual, norm_w, EPS, w, 9, prep), "top_k"),
        ((delta, residual, norm_w, EPS, w, 3, prep), "prep buffers"),
    ]:
        with pytest.raises(ValueError, match=message):
            moe_entry(*args, counters)
    assert counters.all_zero()
