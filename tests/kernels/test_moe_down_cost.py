"""The balanced down launch's view costs (MoeTuning.down_group_cost) and
segment cost (down_segment_cost): validated, packed into one word (a byte per
view, two for the segment cost), carried by choose_tiles, and never changing
the result."""

import pytest
import torch

from kernels.moe_mixed import fused_moe_mixed, moe_mixed_reference
from kernels.moe_tiles import MoeTiles, choose_tiles
from kernels.moe_tuning import DOWN_GROUP_COST, DOWN_SEGMENT_COST, MoeTuning
from tests.kernels.mixed_layer import E, F, H, PAGE, mixed_fields, rel_err
from tests.kernels.paged_store import random_moe


def test_costs_are_validated_and_taken_as_a_tuple():
    assert MoeTuning().down_group_cost == DOWN_GROUP_COST
    assert MoeTuning(down_group_cost=[1, 2, 3, 4, 5]).down_group_cost == (1, 2, 3, 4, 5)
    for bad in ([8, 10, 11, 13], [8, 10, 11, 13, 15, 17], [0, 10, 11, 13, 15], [8, 10, 11, 13, 256],
                [8, 10, 11.5, 13, 15], [True, 10, 11, 13, 15]):
        with pytest.raises(ValueError, match="down_group_cost"):
            MoeTuning(down_group_cost=bad)
        with pytest.raises(ValueError, match="down_group_cost"):
            MoeTiles(down_group_cost=bad)


def test_cost_word_holds_view_f_in_byte_f_minus_one():
    word = MoeTiles(balance_down=True, down_group_cost=(1, 2, 3, 254, 255)).down_cost_word
    assert [(word >> (8 * i)) & 255 for i in range(5)] == [1, 2, 3, 254, 255]
    assert word >> 40 == DOWN_SEGMENT_COST
    word = MoeTiles(balance_down=True, down_group_cost=(255,) * 5, down_segment_cost=65535).down_cost_word
    assert word == 2**56 - 1
    assert MoeTiles(balance_down=True, down_segment_cost=300).down_cost_word >> 40 == 300


def test_an_unbalanced_launch_compiles_no_costs():
    # The costs are not read without balance_down: one compiled variant for any.
    assert MoeTiles(down_group_cost=(1, 2, 3, 254, 255), down_segment_cost=300).down_cost_word == 0
    wide = choose_tiles(64, 2, 8, 4096, 14336, tuning=MoeTuning(down_group_cost=(8, 12, 14, 21, 26)))
    assert wide.block_m_wide and not wide.balance_down and wide.down_cost_word == 0


def test_segment_cost_is_validated():
    assert MoeTuning(down_segment_cost=65535).down_segment_cost == 65535
    for bad in (-1, 65536, 2.0, True, None):
        with pytest.raises(ValueError, match="down_segment_cost"):
            MoeTuning(down_segment_cost=bad)
        with pytest.raises(ValueError, match="down_segment_cost"):
            MoeTiles(down_segment_cost=bad)


def test_choose_tiles_carries_the_tunings_costs():
    costs = (8, 12, 14, 21, 26)
    for tokens in (1, 4, 16, 64):  # one-token, narrow, 16-token and wide-tile launches
        tiles = choose_tiles(tokens, 2, 8, 4096, 14336, tuning=MoeTuning(down_group_cost=costs,
                                                                          down_segment_cost=77))
        assert tiles.down_group_cost == costs and tiles.down_segment_cost == 77
    assert choose_tiles(16, 2, 8, 4096, 14336).down_group_cost == DOWN_GROUP_COST


@pytest.mark.parametrize("block_m,t,costs,segment", [(8, 7, (1, 1, 1, 1, 1), 0), (16, 7, (8, 12, 14, 21, 26), 0),
                                                      (8, 7, (255, 3, 77, 1, 200), 0),
                                                      (1, 3, (255, 3, 77, 1, 200), 0),
                                                      (8, 7, (8, 10, 11, 13, 15), 5),
                                                      (16, 7, (1, 1, 1, 1, 1), 65535),
                                                      (1, 3, (8, 10, 11, 13, 15), 9)])
def test_any_costs_give_the_same_layer(device, block_m, t, costs, segment):
    # The costs only move the programs' shares of a row tile's groups (every
    # view present, one expert host-only): the layer matches the reference.
    # (The one-token tile runs a tile per token: 3 tokens keep it short.) A
    # segment cost past the groups' (65535) leaves some programs an expert's
    # start cost and no group.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=5)
    torch.manual_seed(6)
    x = torch.randn(t, H)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)])
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=block_m, split_k=3, balance_down=True,
                     down_group_cost=costs, down_segment_cost=segment)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F)
    assert out.shape == (t, H) and bool(torch.isfinite(out).all()) and rel_err(out, ref) < 3e-3
