"""The one-token MoE projections in one launch (kernels/moe_gate_up_down.py)
against the plain-torch reference and the two-launch path.

Through the CPU interpreter the programs run one after another in ticket
order, so the waits return at once: what is checked there is the work each
ticket maps to, the counters' reset and the checks. Whether a down program
really waits for its h tiles is only visible on a GPU (the gpu tests repeat
the launch and compare every output)."""

import pytest
import torch

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference
from kernels.moe_gate_up_down import run_gate_up_down
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import MoeTuning
from kernels.moe_workspace import ready_size
from tests.kernels.paged_store import random_moe
from tests.kernels.mixed_layer import E, F, H, PAGE, check_eager_and_replay, mixed_fields, rel_err


def one_launch_tiles(rows: int, split: int, balance: bool, **kw) -> MoeTiles:
    return MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=split, num_warps=rows // 32,
                    balance_down=balance, one_launch=True, **kw)


@pytest.mark.parametrize("rows,split,balance,t,zigzag", [(64, 3, True, 1, False), (128, 2, False, 1, False),
                                                         (128, 2, False, 3, False), (128, 3, True, 4, False),
                                                         (128, 3, True, 4, True)])
def test_one_launch_matches_reference_and_two_launches(device, rows, split, balance, t, zigzag):
    # Mixed views and a host-only expert (4); 3 and 4 tokens: several token
    # tiles per expert, so a tile is ready only when all of them are counted;
    # zigzag: the balanced down programs' experts in the other order.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=31)
    torch.manual_seed(32)
    x = torch.randn(t, H, device=device)
    ids = torch.stack([torch.randperm(E)[:2] for _ in range(t)]).to(device)
    tw = torch.rand(t, 2, device=device)
    counters = ArrivalCounters()
    tiles = one_launch_tiles(rows, split, balance, down_zigzag=zigzag)
    out = fused_moe_mixed(x, ids, tw, weights, 1, E, F, tiles, counters=counters).clone()
    two = fused_moe_mixed(x, ids, tw, weights, 1, E, F, MoeTiles(**{**tiles.__dict__, "one_launch": False}))
    ref = moe_mixed_reference(x, ids, tw, weights, 1, E, F)
    assert out.shape == (t, H) and bool(torch.isfinite(out).all())
    assert rel_err(out, ref) < 3e-3
    torch.testing.assert_close(out, two, rtol=1e-5, atol=1e-5)  # the same sums, in another order
    assert counters.all_zero()


def test_counters_stay_zero_across_layers_and_token_counts(device):
    # The last program zeroes the ready counts, the ticket and the done
    # count: a stale ticket would send the next call's programs to the wrong
    # work, a stale ready count would let a down program read h too early.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=33)
    counters = ArrivalCounters()
    torch.manual_seed(34)
    for layer, t in [(0, 1), (1, 2), (0, 1)]:
        x = torch.randn(t, H, device=device)
        ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)]).to(device)
        tw = torch.rand(t, 2, device=device)
        out = fused_moe_mixed(x, ids, tw, weights, layer, E, F, one_launch_tiles(128, 2, True), counters=counters)
        assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, layer, E, F)) < 3e-3
        assert counters.all_zero()


def test_tiles_and_workspace_checks(device):
    assert one_launch_tiles(128, 2, True).fits_one_launch
    with pytest.raises(ValueError, match="one_launch"):
        MoeTiles(block_m=16, one_launch=True)
    with pytest.raises(ValueError, match="one_launch"):
        MoeTiles(block_n_up=64, block_n_down=128, block_m=1, num_warps=2, one_launch=True)
    on = MoeTuning(one_token_one_launch=True)
    assert choose_tiles(1, 2, 8, 4096, 14336, tuning=on).one_launch
    assert not choose_tiles(1, 2, 8, 4096, 14336).one_launch  # off by default
    assert not choose_tiles(16, 2, 8, 4096, 14336, tuning=on).one_launch  # tensor-core tiles
    assert not choose_tiles(1, 2, 8, 4096, 14336, tuning=on, block_m=16).one_launch
    # A workspace whose ready counters are too few is refused, not overrun.
    tiles = one_launch_tiles(64, 2, False)
    weights = random_moe(1, E, H, F, mixed_fields, PAGE, device, seed=35)
    ws = alloc_workspace(1, 2, H, F, E, tiles, device)
    assert ws.ready.numel() == ready_size(F, E, tiles) == E * (F // 64) + 2
    ws.ready = ws.ready[:-1]
    tw = torch.rand(1, 2, device=device)
    with pytest.raises(ValueError, match="ready"):
        run_gate_up_down(ws, tw, weights, 0, E, 2, F, tiles, 13)
    with pytest.raises(ValueError, match="one launch"):
        run_gate_up_down(ws, tw, weights, 0, E, 2, F, MoeTiles(block_m=16), 13)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,balance", [(128, True), (64, False)])
def test_gpu_one_launch_eager_and_replay(rows, balance):
    # As the two-launch one-token test: eager, then replayed from a graph
    # after the routing changes and a block is demoted.
    gen = torch.Generator().manual_seed(36)
    ids, new_ids = (torch.randperm(8, generator=gen)[:2][None] for _ in range(2))
    check_eager_and_replay("cuda", one_launch_tiles(rows, 4, balance, use_asm=True, num_stages=4), ids, new_ids,
                           seed=36, demote_first_block=True)


@pytest.mark.gpu
def test_gpu_one_launch_repeated_at_mixtral_shapes_equals_two_launches():
    # Mixtral's expert shapes, the tiles choose_tiles gives B=1 with the one
    # launch on: 50 launches, each output against the two launches' (a down
    # program that read h before it was stored would differ).
    hidden, ffn, experts = 4096, 14336, 8
    weights = random_moe(1, experts, hidden, ffn, lambda l, e, p: 3, 1 << 21, "cuda")
    on = choose_tiles(1, 2, experts, hidden, ffn, use_asm=True, tuning=MoeTuning(one_token_one_launch=True))
    assert on.one_launch
    off = MoeTiles(**{**on.__dict__, "one_launch": False})
    counters = ArrivalCounters()
    gen = torch.Generator().manual_seed(37)
    for _ in range(50):
        ids = torch.randperm(experts, generator=gen)[:2][None].to("cuda", torch.int32)
        x = torch.randn(1, hidden, generator=gen).to("cuda")
        tw = torch.rand(1, 2, generator=gen).to("cuda")
        a = fused_moe_mixed(x, ids, tw, weights, 0, experts, ffn, on, counters=counters).clone()
        b = fused_moe_mixed(x, ids, tw, weights, 0, experts, ffn, off)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert counters.all_zero()
