"""The one-token gate/up launch as one round of programs sharing its work by
view cost (MoeTiles.up_programs, kernels/moe_gate_up.py)."""

import pytest
import torch

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference
from kernels.moe_tiles import DEFAULT_SMS, PROGRAMS_PER_SM, MoeTiles, choose_tiles
from tests.kernels.paged_store import random_moe

# H = 384: three groups per row tile, so shares cut tiles into parts of one
# and two groups; F = 384: six 64-row tiles or three 128-row ones.
H, F, E = 384, 384, 6
PAGE = 8192
FIELDS = [5, 1, 3, 2, 4, 3, 1, 5, 2, 4, 4, 2, 3, 5, 1, 2, 3]


def rel_err(a, b):
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def fields(layer, e, proj):
    if e == 5:  # gate and up resident, down host-only: the expert is skipped
        return (3, 2, 0)[proj]
    return FIELDS[(e * 3 + proj + 2 * layer) % len(FIELDS)]


@pytest.mark.parametrize("rows,programs", [(64, 7), (128, 1), (128, 200)])
def test_shared_gate_up_matches_reference_and_leaves_zeros(device, rows, programs):
    # Mixed views (the shares by cost cut row tiles anywhere), several tokens
    # per expert (a counter per token tile), an expert with a host-only block
    # routed, one program for all, and more programs than steps (200: most
    # get none). Two layers through one workspace whose counters and
    # accumulator come from a shared buffer: the second layer is right only
    # if the first left them zero.
    weights = random_moe(2, E, H, F, fields, PAGE, device, seed=31)
    torch.manual_seed(32)
    t = 3
    ids = torch.tensor([[0, 2], [2, 5], [3, 0]])  # experts 0 and 2 twice, 5 skipped
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=2, num_warps=rows // 32,
                     up_programs=programs)
    counters = ArrivalCounters()
    ws = alloc_workspace(t, 2, H, F, E, tiles, device, counters)
    untouched = -(2**15)  # outside the int16 codes
    for layer in (0, 1):
        ws.h_planes.fill_(untouched)
        x = torch.randn(t, H)
        out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, layer, E, F, tiles, ws)
        ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, layer, E, F)
        assert rel_err(out, ref) < 3e-3, layer
        assert counters.all_zero()
        # No step of the skipped expert ran: its pair's h is never written.
        host_only = int((ws.prep.sorted_ids[: 2 * t] == 1 * 2 + 1).nonzero())
        assert bool((ws.h[host_only] == untouched).all())


def test_shared_gate_up_equals_the_per_tile_launch(device):
    # The same h from both launch forms: the K split changes only the order
    # of fp32 additions.
    weights = random_moe(1, E, H, F, fields, PAGE, device, seed=33)
    torch.manual_seed(34)
    x = torch.randn(1, H)
    ids = torch.tensor([[2, 0]])
    tw = torch.rand(1, 2)
    outs = []
    for programs in (0, 9):
        tiles = MoeTiles(block_n_up=64, block_n_down=64, block_m=1, split_k=2, num_warps=2, up_programs=programs)
        ws = alloc_workspace(1, 2, H, F, E, tiles, device)
        fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, tiles, ws)
        outs.append(ws.hq_scale.clone())
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=0)


def test_choose_tiles_shares_the_one_token_gate_up():
    slots = PROGRAMS_PER_SM * DEFAULT_SMS
    assert choose_tiles(1, 2, 8, 4096, 14336).up_programs == slots  # Mixtral: 14336 steps
    assert choose_tiles(1, 4, 60, 2048, 1408).up_programs == slots  # Qwen1.5-MoE: 2816 steps
    # fewer steps than slots (64-row tiles: 2 blocks x 2 tiles x 2 groups): one program each
    assert choose_tiles(1, 1, 2, 256, 128).up_programs == 8
    assert choose_tiles(1, 2, 8, 4096, 14336, balance_up=False).up_programs == 0
    assert choose_tiles(2, 2, 8, 4096, 14336).up_programs == 0  # tensor-core tiles
    with pytest.raises(ValueError, match="up_programs"):
        MoeTiles(block_m=16, up_programs=4)
    with pytest.raises(ValueError, match="up_programs"):
        MoeTiles(block_m=1, up_programs=-1)


def test_workspace_must_have_the_plan_of_the_tiles(device):
    weights = random_moe(1, E, H, F, fields, PAGE, device, seed=35)
    x, ids, tw = torch.randn(1, H), torch.tensor([[1, 3]]), torch.ones(1, 2)
    alloc_for = MoeTiles(block_m=1, split_k=2, up_programs=4)
    ws = alloc_workspace(1, 2, H, F, E, alloc_for, device)
    with pytest.raises(ValueError, match="allocated for other tiles"):
        fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F,
                        MoeTiles(block_m=1, split_k=2, up_programs=5), ws)
