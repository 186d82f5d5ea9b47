"""DemandTracker: the batched update against the per-sequence definition."""

from __future__ import annotations

import pytest
import torch

from dataplane.routing_stats import DemandTracker

LAYERS, EXPERTS, DECAY = 3, 5, 0.9


def _reference_step(means: dict[str, torch.Tensor], ids: list[str], sums: torch.Tensor, ns: list[int]) -> None:
    """decay^n * mean + (1 - decay^n) * S / n per sequence; a new sequence starts at S / n."""
    for i, seq_id in enumerate(ids):
        n = ns[i]
        if n <= 0:
            continue
        step = sums[i].double() / n
        old = means.get(seq_id)
        means[seq_id] = step if old is None else DECAY**n * old + (1 - DECAY**n) * step


def test_batched_update_matches_the_per_sequence_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    tracker = DemandTracker(LAYERS, EXPERTS, DECAY)
    ref: dict[str, torch.Tensor] = {}
    steps = [
        (["a", "b"], [7, 1]),  # both new, a prefill chunk and a decode token
        (["a", "b", "c"], [1, 1, 0]),  # c computed nothing: not tracked yet
        (["b", "c", "a"], [1, 3, 2]),  # order differs from the dict's
    ]
    for ids, ns in steps:
        sums = torch.rand(len(ids), LAYERS, EXPERTS, generator=gen) * torch.tensor(ns)[:, None, None]
        tracker.update(ids, sums, ns)
        _reference_step(ref, ids, sums, ns)
    assert len(tracker) == len(ref) == 3
    expected = sum(ref.values()).float()
    torch.testing.assert_close(tracker.running_demand(), expected, rtol=1e-6, atol=1e-6)
    tracker.remove("a")
    torch.testing.assert_close(tracker.running_demand(), (ref["b"] + ref["c"]).float(), rtol=1e-6, atol=1e-6)


def test_update_with_no_computed_tokens_changes_nothing() -> None:
    tracker = DemandTracker(LAYERS, EXPERTS, DECAY)
    tracker.update(["a"], torch.ones(1, LAYERS, EXPERTS), [0])
    assert len(tracker) == 0
    assert tracker.running_demand().sum() == 0


def test_decay_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="decay"):
        DemandTracker(LAYERS, EXPERTS, 1.0)
