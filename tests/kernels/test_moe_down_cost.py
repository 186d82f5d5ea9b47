"""The balanced down launch's sharing: view costs (MoeTuning.down_group_cost)
and order (down_zigzag): validated, packed into one word (a byte per view, a
bit for the order), carried by choose_tiles, laid out in the plan as asked,
and never changing the result."""

import pytest
import torch

from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import DOWN_GROUP_COST, MoeTuning
from kernels.moe_workspace import down_plan_width
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
    assert word >> 40 == 0
    word = MoeTiles(balance_down=True, down_group_cost=(255,) * 5, down_zigzag=True).down_cost_word
    assert word == 2**41 - 1


def test_an_unbalanced_launch_compiles_no_costs():
    # The costs are not read without balance_down: one compiled variant for any.
    assert MoeTiles(down_group_cost=(1, 2, 3, 254, 255), down_zigzag=True).down_cost_word == 0
    wide = choose_tiles(64, 2, 8, 4096, 14336, tuning=MoeTuning(down_group_cost=(8, 12, 14, 21, 26)))
    assert wide.block_m_wide and not wide.balance_down and wide.down_cost_word == 0


def test_zigzag_is_validated():
    assert MoeTuning(down_zigzag=True).down_zigzag
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="down_zigzag"):
            MoeTuning(down_zigzag=bad)
        with pytest.raises(ValueError, match="down_zigzag"):
            MoeTiles(down_zigzag=bad)


def test_choose_tiles_carries_the_tunings_costs():
    costs = (8, 12, 14, 21, 26)
    for tokens in (1, 4, 16, 64):  # one-token, narrow, 16-token and wide-tile launches
        tiles = choose_tiles(tokens, 2, 8, 4096, 14336, tuning=MoeTuning(down_group_cost=costs,
                                                                          down_zigzag=True))
        assert tiles.down_group_cost == costs and tiles.down_zigzag
    assert choose_tiles(16, 2, 8, 4096, 14336).down_group_cost == DOWN_GROUP_COST


@pytest.mark.parametrize("block_m,t,costs,zigzag", [(8, 7, (1, 1, 1, 1, 1), False), (16, 7, (8, 12, 14, 21, 26), False),
                                                     (8, 7, (255, 3, 77, 1, 200), False),
                                                     (1, 3, (255, 3, 77, 1, 200), False),
                                                     (8, 7, (8, 10, 11, 13, 15), True),
                                                     (16, 7, (255, 3, 77, 1, 200), True),
                                                     (1, 3, (8, 10, 11, 13, 15), True)])
def test_any_costs_give_the_same_layer(device, block_m, t, costs, zigzag):
    # The costs only move the programs' shares of a row tile's groups (every
    # view present, one expert host-only): the layer matches the reference.
    # (The one-token tile runs a tile per token: 3 tokens keep it short.)
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=5)
    torch.manual_seed(6)
    x = torch.randn(t, H)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)])
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=block_m, split_k=3, balance_down=True,
                     down_group_cost=costs, down_zigzag=zigzag)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F)
    assert out.shape == (t, H) and bool(torch.isfinite(out).all()) and rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("zigzag", [False, True])
def test_the_plan_lays_the_experts_out_as_asked(device, zigzag):
    # Every program's plan row: the active experts in the launch's order
    # (costliest first, or alternating from both ends), each expert's work
    # (cost of its down view per group) summed in that order.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=5)
    torch.manual_seed(7)
    t, costs = 7, (8, 10, 11, 13, 15)
    x = torch.randn(t, H)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)])
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=8, split_k=3, balance_down=True,
                     down_group_cost=costs, down_zigzag=zigzag)
    ws = alloc_workspace(t, 2, H, F, E, tiles, device)
    fused_moe_mixed(x.to(device), ids.to(device), torch.rand(t, 2).to(device), weights, 1, E, F, tiles, ws)
    n_act = int(ws.prep.num_active.item())
    active = ws.prep.active[:n_act].tolist()
    assert n_act == 4 and sorted(active) == [0, 1, 2, 3]
    order = active
    if zigzag:
        order = [active[i // 2] if i % 2 == 0 else active[n_act - 1 - i // 2] for i in range(n_act)]
    block0 = 1 * E * 3
    fields = weights.block_fields.tolist()
    work = []
    for x_ in order:
        gate, up, down = fields[block0 + 3 * x_: block0 + 3 * x_ + 3]
        unit = costs[down - 1] if gate and up and down else 0
        work.append(unit * (F // 128))
    width = down_plan_width(E)
    for row in ws.down_plan.cpu():
        assert row[width: width + n_act].tolist() == [block0 + 3 * x_ for x_ in order]
        assert row[:n_act].tolist() == torch.tensor(work).cumsum(0).tolist()
        assert row[width - 1] == sum(work)  # the total the shares are cut from
