"""The one-token gate/up launch split over K (MoeTiles.split_up): each row
tile's gate and up products in split_up K ranges, one program each, added in
K order by the last program to arrive."""

import pytest
import torch

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference, run_gate_up
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import MoeTuning
from tests.kernels.paged_store import random_moe
from tests.kernels.mixed_layer import PAGE, check_eager_and_replay, mixed_fields, rel_err

# Three groups of K: split 2 cuts them unevenly (1 + 2), split 3 one each.
H, F, E = 384, 256, 5


def one_token_tiles(rows: int, split_up: int) -> MoeTiles:
    return MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=2, num_warps=rows // 32,
                    split_up=split_up)


@pytest.mark.parametrize("rows,split_up", [(64, 2), (64, 3), (128, 2)])
def test_split_matches_reference_and_unsplit(device, rows, split_up):
    # Mixed views and a host-only expert (4, skipped by its programs).
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=41)
    counters = ArrivalCounters()
    torch.manual_seed(42)
    for layer in (0, 1):
        x = torch.randn(1, H, device=device)
        ids = torch.tensor([[layer + 1, 4 - layer]], device=device)
        tw = torch.rand(1, 2, device=device)
        out = fused_moe_mixed(x, ids, tw, weights, layer, E, F, one_token_tiles(rows, split_up),
                              counters=counters).clone()
        whole = fused_moe_mixed(x, ids, tw, weights, layer, E, F, one_token_tiles(rows, 1))
        assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, layer, E, F)) < 3e-3
        torch.testing.assert_close(out, whole, rtol=1e-4, atol=1e-5)  # the same sums, grouped otherwise
        # The last program of each pair resets its counter for the next call.
        assert counters.all_zero()


def test_split_h_is_the_same_whoever_arrives_last(device):
    # The partial sums are added in K order, not arrival order: two calls
    # give bit-equal h (on the GPU the arrival order differs between them).
    weights = random_moe(1, E, H, F, mixed_fields, PAGE, device, seed=43)
    tiles = one_token_tiles(64, 3)
    x = torch.randn(1, H, device=device)
    ids = torch.tensor([[0, 2]], device=device)
    tw = torch.rand(1, 2, device=device)
    ws = alloc_workspace(1, 2, H, F, E, tiles, device)
    assert ws.gu.shape == (2, 3, 2, F)
    first = fused_moe_mixed(x, ids, tw, weights, 0, E, F, tiles, ws).clone()
    h_first = ws.h.clone()
    second = fused_moe_mixed(x, ids, tw, weights, 0, E, F, tiles, ws)
    assert torch.equal(ws.h, h_first)
    # The down launch adds its K ranges atomically (in arrival order): close, not equal.
    torch.testing.assert_close(first, second, rtol=1e-5, atol=1e-6)


def test_split_tiles_validate_and_workspace_must_match(device):
    with pytest.raises(ValueError, match="split_up must be >= 1"):
        MoeTiles(block_m=1, split_up=0)
    with pytest.raises(ValueError, match="one-token tile"):
        MoeTiles(block_m=16, split_up=2)
    with pytest.raises(ValueError, match="one-token tile"):
        MoeTiles(block_n_up=128, block_n_down=128, block_m=1, split_up=2, one_launch=True)
    with pytest.raises(ValueError, match="one_token_split_up"):
        MoeTuning(one_token_split_up=0)
    weights = random_moe(1, E, H, F, mixed_fields, PAGE, device, seed=44)
    ws = alloc_workspace(1, 2, H, F, E, one_token_tiles(64, 1), device)
    with pytest.raises(ValueError, match="gate/up split"):
        run_gate_up(ws, weights, 0, E, 2, F, one_token_tiles(64, 2), 16)


def test_choose_tiles_splits_only_where_the_row_tiles_leave_room():
    # Qwen1.5-MoE at B=1: 176 gate/up programs of 64 rows (2 warps), counted
    # 4 a multiprocessor (255 registers a thread): 528 slots hold 3 ranges.
    qwen = dict(num_tokens=1, top_k=4, num_experts=60, hidden=2048, ffn=1408)
    mixtral = dict(num_tokens=1, top_k=2, num_experts=8, hidden=4096, ffn=14336)
    shipped = choose_tiles(**qwen)
    assert (shipped.num_warps, shipped.resident_programs) == (2, 4)
    assert shipped.split_up == MoeTuning().one_token_split_up == 2
    assert choose_tiles(**qwen, tuning=MoeTuning(one_token_split_up=3)).split_up == 3
    assert choose_tiles(**qwen, tuning=MoeTuning(one_token_split_up=9)).split_up == 528 // 176  # 3: 5-6 groups
    assert choose_tiles(**qwen, tuning=MoeTuning(one_token_split_up=1)).split_up == 1
    # Mixtral: 448 programs of 4 warps over 264 slots: never split.
    assert choose_tiles(**mixtral, tuning=MoeTuning(one_token_split_up=9)).split_up == 1
    # A K range holds at least MIN_GROUPS_PER_RANGE groups (small models on many multiprocessors).
    assert choose_tiles(1, 2, 4, 1024, 256, num_sms=1000, tuning=MoeTuning(one_token_split_up=9)).split_up == 2
    assert choose_tiles(1, 2, 8, 256, 384, tuning=MoeTuning(one_token_split_up=9)).split_up == 1  # the default model
    assert choose_tiles(num_tokens=2, top_k=4, num_experts=60, hidden=2048, ffn=1408).split_up == 1  # tensor cores
    both = MoeTuning(one_token_split_up=3, one_token_one_launch=True)
    assert choose_tiles(**mixtral, tuning=both).one_launch and choose_tiles(**mixtral, tuning=both).split_up == 1


@pytest.mark.gpu
@pytest.mark.parametrize("rows,split_up", [(64, 2), (64, 3), (128, 4)])
def test_gpu_split_one_token_and_replay(rows, split_up):
    # The split launch under a graph, replayed with other experts and a
    # demoted block (the arrival counters reset within each launch).
    gen = torch.Generator().manual_seed(45)
    ids, new_ids = (torch.randperm(8, generator=gen)[:2][None] for _ in range(2))
    tiles = MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=4, use_asm=True,
                     num_warps=rows // 32, num_stages=MoeTuning().one_token_stages, split_up=split_up)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=45, demote_first_block=True)
