"""Fused router kernel against plain-torch routing and RoutingStats.record."""

import pytest
import torch

from dataplane.routing_stats import RoutingStats
from kernels.router import route, route_reference


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
