"""Fused router kernel against plain-torch routing and RoutingStats.record."""

import pytest
import torch

from dataplane.routing_stats import RoutingStats
from kernels.router import gate_route, gate_route_reference, route, route_reference


@pytest.mark.parametrize("t,e,k,weighted", [(7, 6, 2, False), (5, 5, 3, True), (1, 8, 1, False)])
def test_route_and_statistics_match_torch(device, t, e, k, weighted):
    torch.manual_seed(t + e)
    logits = (torch.randn(t, e) * 2).to(torch.bfloat16)
    logits[0, 1] = logits[0, 2] = 9.0  # a tie at the top: the lower index comes first
    seq = torch.randint(0, 3, (t,))
    weight = torch.randint(0, 2, (t,)) if weighted else None
    ref_stats = RoutingStats(2, e, seq, 3, weight)
    probs, ref_ids, ref_w = route_reference(logits, k)
    ref_stats.record(1, ref_ids, probs)
    stats = RoutingStats(2, e, seq.to(device), 3, None if weight is None else weight.to(device))
    ids, w = route(logits.to(device), k, stats.targets(1))
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(w.cpu(), ref_w, rtol=1e-6, atol=1e-7)
    assert torch.equal(stats.routed_tokens.cpu(), ref_stats.routed_tokens)
    torch.testing.assert_close(stats.prob_mass.cpu(), ref_stats.prob_mass, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.seq_prob_sum.cpu(), ref_stats.seq_prob_sum, rtol=1e-5, atol=1e-6)
    assert float(stats.prob_mass[0].abs().sum()) == 0.0  # other layers untouched


def test_route_without_statistics_and_bad_input(device):
    logits = torch.randn(3, 4, device=device)
    ids, w = route(logits, 2)
    assert ids.shape == (3, 2) and torch.allclose(w.sum(-1).cpu(), torch.ones(3))
    with pytest.raises(ValueError, match="top_k"):
        route(logits, 5)
    with pytest.raises(ValueError, match="unit last stride"):
        route(logits.t(), 2)


def _gate_inputs(t, h, e, dtype, seed):
    """x [T, H], W [E, H]: logits of spread ~1 around per-expert offsets 0..3, so no near tie decides the top-k."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g) + 0.5
    offset = torch.randperm(e, generator=g).float() * 3 / e  # x's mean 0.5 turns it into a logit offset
    w = torch.randn(e, h, generator=g) / h**0.5 + offset[:, None] / (0.5 * h)
    return x.to(dtype), w.to(dtype)


@pytest.mark.parametrize("t,h,e,k,dtype,record", [
    (1, 200, 8, 2, torch.float32, False), (3, 384, 5, 3, torch.float16, True),
    (7, 1000, 60, 4, torch.float16, False), (7, 200, 60, 1, torch.float32, True),
    (3, 1000, 8, 8, torch.float16, True),
])
def test_gate_route_matches_torch(device, t, h, e, k, dtype, record):
    x, w = _gate_inputs(t, h, e, dtype, seed=t * h + e)
    if dtype == torch.float32:
        probs, ref_ids, ref_w = gate_route_reference(x, w, k)
    else:
        # CPU's half GEMM does not round a float32 sum exactly once (about one logit in 300
        # is an ulp off), so the reference rounds a float32 GEMM as the kernel does.
        probs, ref_ids, ref_w = route_reference(torch.nn.functional.linear(x.float(), w.float()).to(dtype), k)
    seq = torch.arange(t) % 2
    stats = RoutingStats(1, e, seq.to(device), 2, None) if record else None
    xd = torch.zeros(t, h + 3, dtype=dtype, device=device)[:, :h].copy_(x)  # rows strided wider than H
    ids, weights = gate_route(xd, w.to(device), k, stats.targets(0) if record else None)
    assert ids.shape == (t, k) and weights.shape == (t, k) and torch.isfinite(weights).all()
    ids, weights = ids.cpu(), weights.cpu()
    assert ((ids >= 0) & (ids < e)).all() and all(len(set(r.tolist())) == k for r in ids)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-4, atol=1e-5)
    if record:
        ref_stats = RoutingStats(1, e, seq, 2, None)
        ref_stats.record(0, ref_ids, probs)
        assert torch.equal(stats.routed_tokens.cpu(), ref_stats.routed_tokens)
        torch.testing.assert_close(stats.seq_prob_sum.cpu(), ref_stats.seq_prob_sum, rtol=1e-4, atol=1e-5)


def test_gate_route_bad_input(device):
    x, w = torch.randn(3, 16, device=device), torch.randn(4, 16, device=device)
    assert gate_route(x[:0], w, 2)[0].shape == (0, 2)
    for args, message in [
        ((x[0], w, 2), r"x must be \[T, H\]"),
        ((x.t(), w, 2), "unit last stride"),
        ((x, w[:, :8], 2), r"gate_weight must be a contiguous \[E, 16\]"),
        ((x, w.half(), 2), "share one float dtype"),
        ((x, w, 0), "top_k must be in 1..4"),
        ((x, w, 5), "top_k must be in 1..4"),
        ((x, w, 2, RoutingStats(1, 5, torch.zeros(3, dtype=torch.int64, device=device), 1, None).targets(0)),
         "one entry per expert"),
    ]:
        with pytest.raises(ValueError, match=message):
            gate_route(*args)
