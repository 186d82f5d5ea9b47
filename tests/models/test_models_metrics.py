"""RTN quantizer, routing statistics, balance loss and the evaluation counting rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.train.balance_loss import per_layer_balance_loss
from models.train.lm_eval import IGNORE, make_windows
from models.train.routing_metrics import experts_to_cover, js_divergence, usage_report
from models.train.rtn import quantize_rtn


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_rtn_error_and_levels(bits: int) -> None:
    torch.manual_seed(bits)
    w = torch.randn(5, 3, 256) * torch.rand(5, 3, 1)  # [..., K] with groups of varied scale
    q = quantize_rtn(w, bits)
    assert q.shape == w.shape and q.dtype == w.dtype
    groups_w = w.reshape(5, 3, 2, 128)
    groups_q = q.reshape(5, 3, 2, 128)
    lo, hi = groups_w.amin(-1, keepdim=True), groups_w.amax(-1, keepdim=True)
    step = (hi - lo) / (2**bits - 1)
    assert bool(((groups_q - groups_w).abs() <= step / 2 + 1e-6).all())
    assert bool((groups_q >= lo - 1e-6).all() and (groups_q <= hi + 1e-6).all())
    for row in groups_q.reshape(-1, 128):
        assert len(torch.unique(row)) <= 2**bits
    # endpoints are exact, so min and max of every group survive
    assert torch.allclose(groups_q.amin(-1), lo.squeeze(-1), atol=1e-6)
    assert torch.allclose(groups_q.amax(-1), hi.squeeze(-1), atol=1e-6)


def test_rtn_matches_weight_layout_8bit_code_and_constant_groups() -> None:
    w = torch.randn(4, 128)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    s = (hi - lo) / 255
    ref = lo + s * torch.clamp(torch.round((w - lo) / s), 0, 255)
    assert torch.allclose(quantize_rtn(w, 8), ref, atol=1e-6)
    const = torch.full((2, 128), 0.37)
    assert torch.equal(quantize_rtn(const, 2), const)
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantize_rtn(torch.randn(3, 100), 4)


def test_rtn_error_shrinks_with_bits() -> None:
    w = torch.randn(64, 384)
    errs = [float((quantize_rtn(w, b) - w).norm() / w.norm()) for b in (2, 3, 4, 6, 8)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.01 < errs[0]


def test_js_divergence_bounds() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    q = torch.tensor([[0.0, 0.0, 0.5, 0.5]])
    assert float(js_divergence(p, p)) == pytest.approx(0.0, abs=1e-12)
    assert float(js_divergence(p, q)) == pytest.approx(1.0)
    r = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    assert float(js_divergence(p, r)) == pytest.approx(float(js_divergence(r, p)))
    assert 0 < float(js_divergence(p, r)) < 1


def test_usage_report_cold_and_hot_sets() -> None:
    counts = {"a": torch.tensor([[50, 45, 3, 2], [25, 25, 25, 25]]), "b": torch.tensor([[2, 3, 45, 50], [25, 25, 25, 25]])}
    rep = usage_report(counts)
    assert rep["per_domain"]["a"]["cold_experts"] == [2, 0]
    assert rep["per_domain"]["a"]["experts_for_90pct"] == [2, 4]
    js = rep["js_divergence_bits"]["a|b"]
    assert js[0] > 0.5 and js[1] == pytest.approx(0.0, abs=1e-9)
    assert experts_to_cover(torch.tensor([[0.9, 0.1, 0.0]])) == [1]


def test_balance_loss_is_one_when_uniform_and_grows_when_collapsed() -> None:
    tokens, experts = 512, 8
    uniform = torch.zeros(tokens, experts)
    uniform_loss, shares = per_layer_balance_loss((uniform, uniform), top_k=2)
    # ties in topk pick the same experts, so uniform logits still route unevenly; random
    # near-uniform logits are the realistic uniform case
    near = torch.randn(tokens, experts) * 1e-3
    near_loss, near_shares = per_layer_balance_loss((near,), top_k=2)
    assert float(near_loss) == pytest.approx(1.0, abs=0.02)
    assert near_shares.shape == (1, experts) and float(near_shares.sum()) == pytest.approx(1.0)
    collapsed = torch.zeros(tokens, experts, requires_grad=True)
    with torch.no_grad():
        collapsed[:, :2] = 5.0
    loss, _ = per_layer_balance_loss((collapsed, near), top_k=2)
    assert float(loss.detach()) > 2.0
    loss.backward()
    assert collapsed.grad is not None and float(collapsed.grad[:, :2].mean()) > 0  # pushes the hot experts down
    assert float(uniform_loss) >= 1.0 and shares.shape == (2, experts)


def test_windows_follow_the_counting_rule() -> None:
    bos, eos = 1, 2
    stream = np.array([bos, 10, 11, eos, bos, 12, eos, bos, 13, 14, 15, eos], dtype=np.uint16)
    win = make_windows(stream, seq_len=5, bos_id=bos)
    assert win.inputs.shape == (3, 5)
    assert win.inputs.flatten()[:11].tolist() == stream[:11].tolist()
    targets = win.targets.flatten()
    assert targets[:11].tolist() == [10, 11, eos, IGNORE, 12, eos, IGNORE, 13, 14, 15, eos]
    assert bool((targets[11:] == IGNORE).all())
    assert win.counted == len(stream) - 1 - 2  # every next token except the two bos targets
    assert make_windows(stream, seq_len=5, bos_id=bos, max_windows=1).inputs.shape == (1, 5)
    assert math.isclose(win.counted, 9)
