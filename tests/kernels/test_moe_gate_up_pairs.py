"""The gate/up launch with an expert's gate and up blocks in one program
(MoeTiles.gate_up_pair_stages, kernels/moe_pair_matmul.py) against the
plain-torch reference."""

import pytest
import torch

from kernels import weight_layout as wl
from kernels.moe_mixed import fused_moe_mixed, moe_mixed_reference
from kernels.moe_tiles import MoeTiles, choose_tiles
from kernels.moe_tuning import MoeTuning
from tests.kernels.mixed_layer import E, F, H, PAGE, rel_err
from tests.kernels.paged_store import random_moe


def _layer(device, fields, t, seed, ids=None):
    weights = random_moe(1, E, H, F, fields, PAGE, device, seed=seed)
    torch.manual_seed(seed + 1)
    x = torch.randn(t, H)
    if ids is None:
        ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)])
    tw = torch.rand(t, 2)
    return weights, x.to(device), ids.to(device), tw.to(device)


@pytest.mark.parametrize("bits", wl.VIEW_BITS)
@pytest.mark.parametrize("block_m", [8, 16])
def test_pairs_each_view(device, bits, block_m):
    # Gate and up of one view everywhere: every row tile through the pair
    # product; 11 tokens on expert 1 (two 8-token tiles, one of them masked).
    nf = wl.fields_for_bits(bits)
    ids = torch.stack([torch.tensor([1, int(i)]) for i in torch.randint(2, 4, (11,))])
    weights, x, ids, tw = _layer(device, lambda l, e, p: nf, 11, 30 + nf, ids)
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=block_m, split_k=2, gate_up_pair_stages=2)
    out = fused_moe_mixed(x, ids, tw, weights, 0, E, F, tiles)
    ref = moe_mixed_reference(x, ids, tw, weights, 0, E, F)
    assert bool(torch.isfinite(out).all()) and rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("split", [1, 3])
def test_pairs_beside_experts_of_two_views(device, split):
    # Experts 0 and 2 have gate and up of one view (the pair product), 1 and
    # 3 of two (one block a program, the combine by arrival); 4 host-only.
    # split: K ranges per row tile (H = 256: 2 groups, so range 0 is empty
    # at 3), the last pair program to arrive adding them.
    views = {0: (3, 3, 5), 1: (1, 5, 2), 2: (5, 5, 1), 3: (2, 4, 4)}
    weights, x, ids, tw = _layer(device, lambda l, e, p: views[e][p] if e in views else 0, 20, 40)
    for bn_up in (64, 128):
        tiles = MoeTiles(block_n_up=bn_up, block_n_down=128, block_m=8, split_k=2, gate_up_pair_stages=3,
                         split_up=split)
        out = fused_moe_mixed(x, ids, tw, weights, 0, E, F, tiles)
        assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, 0, E, F)) < 3e-3, bn_up


@pytest.mark.parametrize("split", [0, 3])
def test_pairs_with_the_wide_tile(device, split):
    # 40 tokens: experts 0 (30) and 1 (39 + 1) on the wide tile, 3 (10) on
    # the base tile; split: the two token classes in two launches.
    t = 40
    ids = torch.tensor([[1, 3]] * t)
    ids[: t - 10, 1] = 0
    weights, x, ids, tw = _layer(device, lambda l, e, p: [3, 3, 4][p] if e != 1 else 5, t, 50, ids)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=1, block_m_wide=32,
                     gate_up_split_stages=split, gate_up_pair_stages=2)
    out = fused_moe_mixed(x, ids, tw, weights, 0, E, F, tiles)
    assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, 0, E, F)) < 3e-3


def test_pair_stages_reach_the_tensor_core_tiles_only():
    tuning = MoeTuning(gate_up_pair_stages=3)
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=tuning).gate_up_pair_stages == 3
    assert choose_tiles(1, 2, 8, 4096, 14336, tuning=tuning).gate_up_pair_stages == 0
    assert choose_tiles(16, 2, 8, 4096, 14336).gate_up_pair_stages == MoeTuning().gate_up_pair_stages
    split = MoeTuning(gate_up_pair_stages=3, gate_up_pair_split=2)
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=split).split_up == 2
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(gate_up_pair_split=2)).split_up == 1
    with pytest.raises(ValueError, match="split_up"):
        MoeTiles(block_m=16, split_up=2)
    with pytest.raises(ValueError, match="gate_up_pair_stages"):
        MoeTiles(block_m=1, gate_up_pair_stages=2)
    with pytest.raises(ValueError, match="gate_up_pair_stages"):
        MoeTuning(gate_up_pair_stages=-1)
