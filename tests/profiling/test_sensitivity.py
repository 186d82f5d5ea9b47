"""Sensitivity profiler (dataplane/profiling): the trace formula, the table's
contract, zero-routed experts, the KL calibration of the units, and the whole
profile of a small random checkpoint on a small token corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from controlplane.sensitivity import BITS_AXIS, load, save, validate_cost
from dataplane.layers.experts import DenseExperts
from dataplane.profiling.kl_calibration import calibrated_table, calibrated_table_per_view, kl_scales, view_scales
from dataplane.profiling.moments import RecordingExperts
from dataplane.profiling.sensitivity import (
    ProfileConfig,
    block_weighting,
    expert_stats,
    load_model,
    profile,
    quadratic_cost,
    raw_costs,
    relative_costs,
    view_deltas,
)
from dataplane.profiling.window_forward import WindowForward
from dataplane.weights.layout import PROJ_DOWN, PROJ_GATE, VIEW_BITS
from models.train.tokenize_corpus import META_FILE, stream_path, write_stream
from tools.make_random_checkpoint import make_random_checkpoint

HIDDEN, FFN, EXPERTS, TOP_K = 128, 256, 4, 2
SEQ_LEN = 32
DOMAINS = ("alpha", "beta")
SPLIT_TOKENS = 2048


def recorded_experts(tokens: int, seed: int, allowed: list[int]) -> tuple[RecordingExperts, dict]:
    """One layer of random experts run on random tokens routed only to ``allowed``."""
    gen = torch.Generator().manual_seed(seed)
    dense = DenseExperts(EXPERTS, HIDDEN, FFN, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        for p in (dense.w1, dense.w3, dense.w2):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    rec = RecordingExperts(dense)
    x = torch.randn(tokens, HIDDEN, generator=gen) * torch.linspace(0.2, 2.0, HIDDEN)  # [T, H] anisotropic
    pick = torch.tensor(allowed)[torch.stack([torch.randperm(len(allowed), generator=gen)[:TOP_K]
                                              for _ in range(tokens)])]  # [T, k] distinct experts
    weights = torch.softmax(torch.randn(tokens, TOP_K, generator=gen), dim=-1)  # [T, k]
    with torch.no_grad():
        out = rec(x, pick, weights)
        torch.testing.assert_close(out, dense(x, pick, weights))  # recording does not change the output
    return rec, {"x": x, "ids": pick, "weights": weights}


def routed_rows(data: dict, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    tok, slot = torch.where(data["ids"] == expert)
    return data["x"][tok], data["weights"][tok, slot]


@pytest.mark.parametrize("weighting", ["input", "output"])
def test_trace_formula_equals_direct_output_error(weighting):
    rec, data = recorded_experts(tokens=300, seed=1, allowed=list(range(EXPERTS)))
    expert = 2
    stats = expert_stats(rec.moments, expert)
    xe, g = routed_rows(data, expert)  # [n, H], [n]
    w1, w3, w2 = (p[expert].detach() for p in (rec.inner.w1, rec.inner.w3, rec.inner.w2))
    assert stats.count == xe.shape[0] > 0
    h = F.silu(xe @ w1.T) * (xe @ w3.T)  # [n, F]: the down block's input
    scale = (g * g)[:, None] if weighting == "output" else torch.ones_like(g)[:, None]
    for bits, delta in view_deltas(w2).items():
        direct = float((scale * (h @ delta.T) ** 2).sum()) / xe.shape[0]  # mean over routed tokens
        sigma, rows = block_weighting(stats, PROJ_DOWN, weighting, w2)
        assert rows is None
        assert quadratic_cost(delta, sigma) == pytest.approx(direct, rel=1e-6), bits
    if weighting == "input":  # gate: the plain input second moment
        delta = view_deltas(w1)[3]
        direct = float(((xe @ delta.T) ** 2).sum()) / xe.shape[0]
        sigma, _ = block_weighting(stats, PROJ_GATE, weighting, w2)
        assert quadratic_cost(delta, sigma) == pytest.approx(direct, rel=1e-6)


def test_costs_of_zero_routed_expert_are_finite_and_ordered():
    rec, _ = recorded_experts(tokens=200, seed=2, allowed=[0, 1, 2])  # expert 3 never routed
    assert int(rec.moments.count[3]) == 0
    weights = [(rec.inner.w1.detach(), rec.inner.w3.detach(), rec.inner.w2.detach())]
    raw = raw_costs(weights, [rec.moments], "output", progress=False)  # [1, E, 3, views]
    assert np.all(np.isfinite(raw)) and np.all(raw[0, 3, :, 0] > 0)
    table = relative_costs(raw)
    validate_cost(table)
    assert np.all(table[0, 3, :, BITS_AXIS.index(2)] > table[0, 3, :, BITS_AXIS.index(4)])


def test_relative_costs_contract():
    raw = np.array([[[[4.0, 1.0, 2.0, 0.3, 0.5]]]])  # [1, 1, 1, views 2..8]: 3 < 4 and 6 < 8 (noise)
    table = relative_costs(raw)[0, 0, 0]  # [bits 0, 2, 3, 4, 6, 8]
    np.testing.assert_allclose(table, [0.0, 3.5, 1.5, 1.5, 0.0, 0.0])
    assert table[0] == table[-1]  # host-only is served at the master view
    assert np.all(np.diff(table[1:]) <= 0)


def test_kl_calibration_reproduces_group_kl():
    rng = np.random.default_rng(0)
    cost = relative_costs(rng.exponential(1.0, size=(3, EXPERTS, 3, len(VIEW_BITS)))[..., ::-1].cumsum(-1)[..., ::-1])
    routed = rng.dirichlet(np.ones(EXPERTS), size=3) * TOP_K  # [L, E], rows sum to top_k
    kl = rng.uniform(0.01, 0.1, size=(3, 3))
    kl[1, 2] = 0.0  # a group whose demotion is free stays free
    idx = BITS_AXIS.index(3)
    table = calibrated_table(cost, kl_scales(cost, kl, routed, idx), TOP_K)
    predicted = np.einsum("le,lep->lp", routed, table[..., idx]) * EXPERTS / TOP_K
    np.testing.assert_allclose(predicted, kl, rtol=1e-12)
    validate_cost(table)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    ckpt = make_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "rand", hidden_size=HIDDEN,
                                  intermediate_size=FFN, num_layers=2, num_experts=EXPERTS, top_k=TOP_K)
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    tokens = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    meta = {"bos_id": 0, "eos_id": 1, "domains": {}}
    for domain in DOMAINS:
        meta["domains"][domain] = {}
        for split in ("train", "validation", "test"):
            stream = rng.integers(2, vocab, size=SPLIT_TOKENS).astype(np.uint16)
            sha = write_stream(stream, stream_path(tokens, domain, split))
            meta["domains"][domain][split] = {"documents": 1, "tokens": SPLIT_TOKENS, "text_bytes": SPLIT_TOKENS,
                                              "sha256": sha}
    (tokens / META_FILE).write_text(json.dumps(meta))
    return ckpt, tokens


def test_profile_of_random_checkpoint(tiny_corpus, tmp_path):
    ckpt, tokens = tiny_corpus
    cfg = ProfileConfig(tokens=8 * SEQ_LEN, seq_len=SEQ_LEN, batch=4, kl_windows_per_domain=1)
    table, record = profile(ckpt, tokens, cfg, progress=False)
    path = tmp_path / "sensitivity.json"
    save(table, path, model_name="rand", units=record["units"])
    loaded = load(path)
    assert loaded.cost.shape == (2, EXPERTS, 3, len(BITS_AXIS))
    cost = loaded.cost
    assert np.all(np.isfinite(cost)) and np.all(cost >= 0)
    assert np.all(np.diff(cost[..., 1:], axis=-1) <= 1e-12)
    np.testing.assert_array_equal(cost[..., 0], cost[..., -1])  # host-only = the master view
    assert np.all(cost[..., -1] == 0) and np.any(cost[..., 1] > 0)
    calib = record["calibration"]
    assert calib["tokens"] == 8 * SEQ_LEN and calib["windows_per_domain"] == {d: 4 for d in DOMAINS}
    assert np.sum(record["routed_tokens"]) == 2 * TOP_K * 8 * SEQ_LEN  # layers * top_k * tokens
    assert record["kl_calibration"]["enabled"] and len(calib["tokens_sha256"]) == 64
    again, record2 = profile(ckpt, tokens, cfg, progress=False)  # deterministic
    np.testing.assert_array_equal(again.cost, table.cost)
    assert record2["calibration"]["tokens_sha256"] == calib["tokens_sha256"]


def test_window_forward_batches_are_independent(tiny_corpus):
    """A window's log-probs do not depend on the other windows of its batch."""
    ckpt, _ = tiny_corpus
    model, loaded = load_model(ckpt)
    runner = WindowForward(model, loaded.spec, max_batch=3, seq_len=SEQ_LEN)
    windows = torch.randint(2, loaded.spec.vocab_size, (3, SEQ_LEN), generator=torch.Generator().manual_seed(3))
    together = runner.log_probs(windows)  # [3, S, V]
    assert together.shape == (3, SEQ_LEN, loaded.spec.vocab_size)
    for i in range(3):
        torch.testing.assert_close(runner.log_probs(windows[i:i + 1])[0], together[i], atol=1e-5, rtol=1e-5)
    _, routing = runner.hidden(windows)
    assert int(routing.routed_tokens.sum()) == loaded.spec.num_layers * TOP_K * 3 * SEQ_LEN
    with pytest.raises(ValueError):
        runner.hidden(torch.zeros(4, SEQ_LEN, dtype=torch.int64))  # more windows than max_batch


def test_per_view_calibration_reproduces_each_view_and_fills_gaps():
    rng = np.random.default_rng(1)
    cost = relative_costs(rng.exponential(1.0, size=(2, EXPERTS, 3, len(VIEW_BITS)))[..., ::-1].cumsum(-1)[..., ::-1])
    routed = rng.dirichlet(np.ones(EXPERTS), size=2) * TOP_K  # [L, E]
    kl = {2: rng.uniform(0.2, 0.4, size=(2, 3)), 3: rng.uniform(0.05, 0.1, size=(2, 3))}
    kl[3][0, 1] = 0.0  # unusable at 3 bits: borrows the nearest measured view (2)
    scale = view_scales(cost, kl, routed, BITS_AXIS)  # [L, 3, bits]
    assert scale[0, 1, BITS_AXIS.index(3)] == scale[0, 1, BITS_AXIS.index(2)] > 0
    assert np.all(scale[..., BITS_AXIS.index(4)] == scale[..., BITS_AXIS.index(3)])  # 4, 6, 8 borrow 3
    assert np.all(scale[..., BITS_AXIS.index(0)] == scale[..., BITS_AXIS.index(2)])
    table = calibrated_table_per_view(cost, scale, TOP_K)
    validate_cost(table)  # non-increasing in bits, finite
    for bits, measured in kl.items():
        i = BITS_AXIS.index(bits)
        predicted = np.einsum("le,lep->lp", routed, table[..., i]) * EXPERTS / TOP_K
        raw = np.einsum("le,lep->lp", routed, cost[..., i] * scale[:, None, :, i])  # before the monotone lift
        ok = measured > 0
        # Where monotonicity did not have to lift the view, the table predicts the measured KL.
        lifted = predicted > raw * (1 + 1e-9)
        np.testing.assert_allclose(predicted[ok & ~lifted], measured[ok & ~lifted], rtol=1e-9)
