"""Gate/up row tiles over one weight group (MoeTiles.block_n_up > 128): each
activation tile serves more weight rows, and the gate/up launch writes the
down launch's activation sums per group instead of per row tile."""

import pytest
import torch

from kernels import moe_gate_up
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import MoeTuning
from tests.kernels.mixed_layer import E, H, PAGE, check_eager_and_replay, mixed_fields, rel_err
from tests.kernels.paged_store import random_moe

F_WIDE_ROWS = 512  # two row tiles of 256 per gate/up block


def _layer(device, tiles, seed=5):
    weights = random_moe(1, E, H, F_WIDE_ROWS, mixed_fields, PAGE, device, seed=seed)
    torch.manual_seed(seed + 1)
    t = 7
    x = torch.randn(t, H, device=device)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)]).to(device)  # expert 4 host-only
    tw = torch.rand(t, 2, device=device)
    ws = alloc_workspace(t, 2, H, F_WIDE_ROWS, E, tiles, device)
    out = fused_moe_mixed(x, ids, tw, weights, 0, E, F_WIDE_ROWS, tiles, ws)
    ref = moe_mixed_reference(x, ids, tw, weights, 0, E, F_WIDE_ROWS)
    return out, ref, ws


@pytest.mark.parametrize("block_m,warps,bn_down,balance", [(16, 8, 256, False), (16, 4, 128, True),
                                                           (8, 8, 128, False)])
def test_row_tiles_of_two_groups_match_reference(device, block_m, warps, bn_down, balance):
    tiles = MoeTiles(block_n_up=256, block_n_down=bn_down, block_m=block_m, split_k=2, num_warps=warps,
                     balance_down=balance)
    out, ref, ws = _layer(device, tiles)
    assert ws.hsum.shape == (14, F_WIDE_ROWS // 128)
    assert bool(torch.isfinite(out).all()) and rel_err(out, ref) < 3e-3


def test_h_sums_per_group_are_the_sums_of_h(device):
    # The down launch's offset term reads these: each must be its group's
    # sum of h (plane 0), whichever row tile wrote it.
    tiles = MoeTiles(block_n_up=256, block_n_down=128, block_m=16, split_k=2, num_warps=8)
    _, _, ws = _layer(device, tiles)
    pairs = int(ws.prep.offsets[-1])
    h = ws.h[:pairs].float().reshape(pairs, F_WIDE_ROWS // 128, 128)  # [pairs, groups, 128]
    torch.testing.assert_close(ws.hsum[:pairs], h.sum(-1), rtol=1e-4, atol=1e-4)


def test_wide_row_tiles_need_a_tensor_core_tile():
    with pytest.raises(ValueError, match="tensor-core tile"):
        MoeTiles(block_n_up=256, block_n_down=256, block_m=1, num_warps=8)
    assert MoeTiles(block_n_up=256, block_n_down=128, block_m=16, num_warps=8).h_sum_rows == 128
    assert MoeTiles(block_n_up=64, block_m=16).h_sum_rows == 64


def test_choose_tiles_takes_the_tuned_rows_where_they_fit():
    rows = MoeTuning(tensor_core_rows=256)
    tiles = choose_tiles(64, 2, 8, 4096, 14336, tuning=rows)
    assert (tiles.block_n_up, tiles.block_n_down, tiles.num_warps, tiles.resident_programs) == (256, 256, 8, 1)
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=rows).block_n_up == 256  # the 8-token tile too
    assert choose_tiles(1, 2, 8, 4096, 14336, tuning=rows).block_n_up == 128  # not the CUDA-core tile
    assert choose_tiles(16, 4, 60, 2048, 1408, tuning=rows).block_n_up == 128  # Qwen: 1408 rows
    few = choose_tiles(64, 2, 8, 4096, 1024, num_sms=132, tuning=rows)  # 2 x 4 x 8 programs < 132
    assert (few.block_n_down, few.num_warps) == (128, 4)
    default = choose_tiles(64, 2, 8, 4096, 14336)
    assert (default.block_n_up, default.num_warps, default.resident_programs) == (128, 4, 2)
    with pytest.raises(ValueError, match="tensor_core_rows"):
        MoeTuning(tensor_core_rows=192)


@pytest.mark.gpu
@pytest.mark.parametrize("wide,split", [(0, 0), (32, 4)])
def test_gpu_row_tiles_of_two_groups_and_replay(wide, split):
    gen = torch.Generator().manual_seed(13)
    ids, new_ids = (torch.stack([torch.randperm(n, generator=gen)[:2] for _ in range(48)]) for n in (3, 8))
    tiles = MoeTiles(block_n_up=256, block_n_down=256, block_m=16, split_k=2, use_asm=True, num_warps=8,
                     block_m_wide=wide, num_stages=4 if not wide else 3, wide_stages=3 if wide else 0,
                     gate_up_split_stages=split)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=13, ffn=1536)
