"""The precision states of the end-to-end decode benchmark
(benchmarks/precision_states.py): what --bits accepts, and that a state puts
each block where it says, whatever the store held before."""

from __future__ import annotations

import pytest
import torch

from benchmarks.precision_states import expert_bytes, precision_label, set_precision, state_bits
from dataplane.memory.arena import Arena
from dataplane.weights.codec import encode
from dataplane.weights.layout import NUM_PROJ
from dataplane.weights.store import WeightStore

LAYERS, EXPERTS = 2, 2


def test_state_bits_reads_views_and_mixed_pairs_in_either_order():
    assert state_bits("4") == (4, 4)
    assert state_bits("mixed26") == state_bits("mixed62") == (6, 2)
    assert state_bits("mixed48") == (8, 4)
    for bad in ("5", "mixed27", "mixed2", "mixed268", "mixedab", "four", ""):
        with pytest.raises(ValueError, match="view"):
            state_bits(bad)


def test_set_precision_puts_even_experts_wide_and_odd_narrow_from_any_state():
    gen = torch.Generator().manual_seed(3)
    blocks = [encode(torch.randn(64, 128, generator=gen)) for _ in range(LAYERS * EXPERTS * NUM_PROJ)]
    store = WeightStore(Arena(160, 4096), blocks, initial_bits=8)
    uniform_bytes = {}
    for state in ("4", "2", "6", "mixed26", "8", "mixed48", "4"):
        set_precision(store, state)
        even, odd = state_bits(state)
        want = [even if (blk // NUM_PROJ) % 2 == 0 else odd for blk in range(store.num_blocks)]
        assert store.block_bits() == want, state
        assert precision_label(store) == (str(even) if even == odd else f"mixed {odd}/{even}")
        per_expert = expert_bytes(store, LAYERS, EXPERTS)  # [layers, experts]
        if even == odd:
            uniform_bytes[even] = per_expert
        else:
            assert torch.equal(per_expert[:, 0], uniform_bytes[even][:, 0])
            assert torch.equal(per_expert[:, 1], uniform_bytes[odd][:, 1])
