"""The shared arrival counters of the gate/up launches (kernels/arrival_counters.py):
zero after every launch whatever the layer and size, and views that grow."""

import pytest
import torch

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_mixed import fused_moe_mixed, moe_mixed_reference
from kernels.moe_tiles import MoeTiles
from tests.kernels.mixed_layer import E, F, H, PAGE, mixed_fields, rel_err
from tests.kernels.paged_store import random_moe


@pytest.mark.parametrize("block_m", [16, 1])
def test_shared_arrival_counters_serve_layers_and_sizes_and_stay_zero(device, block_m):
    # One zeroed counter buffer (kernels/arrival_counters.py) serves every
    # layer and token count with no fill per call: each gate/up launch must
    # leave it zero, or the next call's pairs would see stale arrivals and
    # combine before both halves are written.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=7)
    counters = ArrivalCounters()
    torch.manual_seed(8)
    # Both layers, sizes up and down, the largest in the middle. Few tokens:
    # at block_m = 1 the interpreter's time is ~7 s a token.
    sizes = [(0, 2), (1, 1), (0, 2), (1, 3), (1, 1)]
    for layer, t in sizes:
        x = torch.randn(t, H, device=device)
        ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)]).to(device)
        tw = torch.rand(t, 2, device=device)
        tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=block_m, split_k=2)
        out = fused_moe_mixed(x, ids, tw, weights, layer, E, F, tiles, counters=counters)
        ref = moe_mixed_reference(x, ids, tw, weights, layer, E, F)
        assert rel_err(out, ref) < 3e-3
        assert counters.all_zero()
    # The buffer grew to the largest call's size and the views came from it.
    largest = max(t for _, t in sizes)
    assert counters.allocated_bytes() >= 4 * E * (F // 64) * max(1, -(-largest * 2 // block_m))


def test_arrival_counters_views_grow_and_keep_old_buffers():
    counters = ArrivalCounters()
    a = counters.take((2, 3), "cpu")
    assert a.shape == (2, 3) and a.dtype == torch.int32 and int(a.count_nonzero()) == 0
    b = counters.take((1, 4), "cpu")
    assert b.data_ptr() == a.data_ptr()  # fits: same buffer
    c = counters.take((5, 5), "cpu")
    assert c.numel() == 25 and c.data_ptr() != a.data_ptr()
    assert counters.allocated_bytes() == 4 * (6 + 25)  # the first buffer is kept (graphs may read it)
    assert counters.all_zero()
    c.fill_(1)
    assert not counters.all_zero()
    assert counters.take((0,), "cpu").numel() == 0
    with pytest.raises(ValueError, match="negative"):
        counters.take((-1, 2), "cpu")
