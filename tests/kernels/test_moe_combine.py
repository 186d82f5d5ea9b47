"""The gate/up launch apart from its combine (MoeTiles.gate_up_apart,
kernels/moe_combine.py): a program per token tile storing partial sums, then
the combine launch making h, against the plain-torch reference, on every
token tile kind, with experts over several tiles, both token classes and the
one-token K split."""

from dataclasses import replace

import pytest
import torch

from kernels import moe_gate_up
from kernels.moe_align import moe_prepare
from kernels.moe_combine import run_combine
from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference, run_gate_up
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_paged import PROJ_DOWN
from kernels.moe_tuning import MoeTuning
from kernels.weight_layout import NUM_PLANES, view_plane
from tests.kernels.mixed_layer import E, F, H, PAGE, check_eager_and_replay, check_two_expert_layer, mixed_fields, \
    rel_err
from tests.kernels.paged_store import random_moe


@pytest.mark.parametrize("t,block_m,wide,split", [(20, 16, 0, 0), (40, 16, 32, 0), (40, 16, 32, 2), (20, 8, 0, 0)])
def test_apart_over_several_token_tiles(device, t, block_m, wide, split):
    # Expert 1 holds every token (two or three tiles; t = 40: two wide ones),
    # expert 0 t - 10 of them where t > 32 (both token classes), expert 2 is
    # host-only, one slot ignored (-1). split: gate/up as two launches, one
    # per token class, the combine after both.
    check_two_expert_layer(device, t, MoeTiles(block_n_up=128, block_n_down=128, block_m=block_m, split_k=1,
                                               block_m_wide=wide, gate_up_split_stages=split, gate_up_apart=True))


@pytest.mark.parametrize("block_m,wide,split", [(8, 0, 0), (16, 32, 2)])
def test_apart_sums_in_fp16(device, block_m, wide, split):
    # MoeTiles.gate_up_sums_fp16: the partial sums rounded to fp16 on their
    # way through gu still give the reference's layer.
    check_two_expert_layer(device, 40, MoeTiles(block_n_up=128, block_n_down=128, block_m=block_m, split_k=1,
                                                block_m_wide=wide, gate_up_split_stages=split, gate_up_apart=True,
                                                gate_up_sums_fp16=True))


def test_fp16_sums_past_fp16_range_clamp_and_keep_h_finite(device):
    # x of +-60000 drives gate / up pre-activations to ~1.3e5 (fp32 sums):
    # in fp16 gu they are clamped to +-65504, not infinite (an infinite gate
    # makes SiLU NaN), so h stays finite, as the fp32 path's.
    weights = random_moe(1, E, H, F, lambda l, e, p: [2, 5, 3][p], PAGE, device, seed=5)
    torch.manual_seed(6)
    t = 5
    x = (torch.randn(t, H).sign() * 6e4).to(torch.float16).to(device)
    ids = torch.tensor([[1, 3]] * t, device=device)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=8, split_k=1, gate_up_apart=True,
                     gate_up_sums_fp16=True)
    ws = alloc_workspace(t, 2, H, F, E, tiles, device)
    assert ws.gu.dtype == torch.float16
    moe_prepare(x, ids, E, ws.prep)
    run_gate_up(ws, weights, 0, E, 2, F, tiles, PAGE.bit_length() - 1)
    assert float(ws.gu[: 2 * t].float().abs().max()) == 65504.0
    assert bool(torch.isfinite(ws.h_planes[view_plane(3), : 2 * t]).all())  # the 3-field down view's plane
    with pytest.raises(ValueError, match="sums dtype"):
        run_gate_up(alloc_workspace(t, 2, H, F, E, replace(tiles, gate_up_sums_fp16=False), device), weights, 0, E,
                    2, F, tiles, PAGE.bit_length() - 1)


@pytest.mark.parametrize("bn_up,split_up", [(128, 1), (64, 2)])
def test_apart_one_token_tile_mixed_bits(device, bn_up, split_up):
    # The CUDA-core tile (int16 h and its scales from the combine), every
    # view in one launch, with and without the one-token K split (its parts
    # added by the combine; in fp16 there, MoeTiles.gate_up_sums_fp16).
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=3)
    torch.manual_seed(4)
    x, tw = torch.randn(6, H), torch.rand(6, 2)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(6)])
    tiles = MoeTiles(block_n_up=bn_up, block_n_down=128, block_m=1, split_k=2, split_up=split_up,
                     gate_up_apart=True, gate_up_sums_fp16=split_up > 1)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F)
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("distinct", [False, True])
def test_chosen_tiles_take_apart_only_for_distinct_ids(device, monkeypatch, distinct):
    # Tiles chosen by fused_moe_mixed: apart only where the caller vouches for
    # distinct ids; without, ids that repeat in a row (expert 1 twice: 2 * t
    # pairs, more than the apart grid's t) still give the reference's sum.
    seen = []
    real = moe_gate_up.apart_token_tiles
    monkeypatch.setattr(moe_gate_up, "apart_token_tiles", lambda *a: seen.append(a) or real(*a))
    weights = random_moe(1, E, H, F, mixed_fields, PAGE, device, seed=9)
    torch.manual_seed(10)
    t = 12
    x, tw = torch.randn(t, H), torch.rand(t, 2)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)]) if distinct else torch.tensor([[1, 1]] * t)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, distinct_ids=distinct)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F)
    assert rel_err(out, ref) < 3e-3
    assert bool(seen) == distinct


def test_combine_writes_what_the_in_launch_combine_writes(device):
    # The same gate/up sums combined in the launch (all three h planes) and by
    # the combine launch: all planes equal, and with combine_one_plane (of
    # each expert's rows only the plane its down view reads,
    # weight_layout.view_plane) that plane and the sums equal, the other
    # planes not written. Experts 0-3's down blocks hold 1 / 5 / 3 / 4
    # fields: planes 2, 0, 1, 0.
    down = [1, 5, 3, 4, 0]
    weights = random_moe(1, E, H, F, lambda l, e, p: down[e] if p == PROJ_DOWN else mixed_fields(l, e, p), PAGE,
                         device, seed=7)
    torch.manual_seed(8)
    t = 11
    x = torch.randn(t, H, device=device)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)]).to(device)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=8, split_k=1)
    ws = alloc_workspace(t, 2, H, F, E, tiles, device)
    moe_prepare(x, ids, E, ws.prep)
    run_gate_up(ws, weights, 0, E, 2, F, tiles, PAGE.bit_length() - 1)
    want = [ws.h_planes.clone(), ws.hsum.clone()]
    ws.h_planes.zero_()
    ws.hsum.zero_()
    run_combine(ws, weights, 0, E, 2, F, tiles)
    assert torch.equal(ws.h_planes, want[0]) and torch.equal(ws.hsum, want[1])
    ws.h_planes.zero_()
    ws.hsum.zero_()
    run_combine(ws, weights, 0, E, 2, F, replace(tiles, combine_one_plane=True))
    assert torch.equal(ws.hsum, want[1])
    offsets = ws.prep.offsets.tolist()
    planes = set()
    for e in range(4):
        plane = view_plane(down[e])
        rows = slice(offsets[e], offsets[e + 1])
        planes.add(plane)
        for p in range(NUM_PLANES):
            got = ws.h_planes[p, rows]
            assert torch.equal(got, want[0][p, rows]) if p == plane else not got.any(), (e, p)
    assert planes == {0, 1, 2}


def test_apart_is_chosen_for_tensor_core_tiles_up_to_its_token_bound():
    # choose_tiles: apart from 2 up to gate_up_apart_max_tokens tokens, never
    # for the one-token tile (measured slower) nor with the bound at 0.
    for t in (2, 16, 64):
        assert choose_tiles(t, 2, 8, 4096, 14336).gate_up_apart
    assert not choose_tiles(1, 2, 8, 4096, 14336).gate_up_apart
    assert not choose_tiles(65, 2, 8, 4096, 14336).gate_up_apart
    assert not choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(gate_up_apart_max_tokens=0)).gate_up_apart
    assert choose_tiles(128, 2, 8, 4096, 14336, tuning=MoeTuning(gate_up_apart_max_tokens=128)).gate_up_apart
    with pytest.raises(ValueError, match="one_launch"):
        MoeTiles(block_m=1, block_n_up=128, block_n_down=128, one_launch=True, gate_up_apart=True)
    # gate_up_sums_fp16 (shipped on): only where the launch is apart.
    assert choose_tiles(16, 2, 8, 4096, 14336).gate_up_sums_fp16
    assert not choose_tiles(1, 2, 8, 4096, 14336).gate_up_sums_fp16
    assert not choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(gate_up_sums_fp16=False)).gate_up_sums_fp16
    # combine_one_plane (shipped on): likewise.
    all_planes = MoeTuning(combine_one_plane=False)
    assert choose_tiles(16, 2, 8, 4096, 14336).combine_one_plane
    assert not choose_tiles(1, 2, 8, 4096, 14336).combine_one_plane
    assert not choose_tiles(16, 2, 8, 4096, 14336, tuning=all_planes).combine_one_plane
    for make in (MoeTuning, MoeTiles):
        for name in ("gate_up_sums_fp16", "combine_one_plane"):
            with pytest.raises(ValueError, match=name):
                make(**{name: 1})
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="gate_up_apart_max_tokens"):
            MoeTuning(gate_up_apart_max_tokens=bad)


def test_gate_up_cap_reaches_the_base_tile_alone():
    # MoeTuning.base_tile_gate_up_maxnreg: the apart 16-token tile's gate/up
    # launches only (B = 32; B = 64, whose wide-tile launch stays uncapped in
    # _launch_gate_up), not the 8-token tile, nor tiles without apart.
    capped = MoeTuning(base_tile_gate_up_maxnreg=168)
    assert choose_tiles(32, 2, 8, 4096, 14336, tuning=capped).gate_up_maxnreg == 168
    assert choose_tiles(64, 2, 8, 4096, 14336, tuning=capped).gate_up_maxnreg == 168
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=capped).gate_up_maxnreg is None
    assert choose_tiles(128, 2, 8, 4096, 14336, tuning=capped).gate_up_maxnreg is None
    assert choose_tiles(32, 2, 8, 4096, 14336).gate_up_maxnreg is None
    for bad in (0, 256, True):
        with pytest.raises(ValueError, match="gate_up_maxnreg"):
            MoeTiles(gate_up_maxnreg=bad)
    for bad in (0, 256):
        with pytest.raises(ValueError, match="base_tile_gate_up_maxnreg"):
            MoeTuning(base_tile_gate_up_maxnreg=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,wide,split,cap,fp16,one_plane", [
    (8, 0, 0, None, False, False), (16, 32, 4, None, False, False), (1, 0, 0, None, False, False),
    (16, 32, 4, 168, False, False), (16, 32, 4, None, True, False), (8, 0, 0, None, True, True)])
def test_gpu_apart_and_replay(block_m, wide, split, cap, fp16, one_plane):
    # As choose_tiles builds the tiles at B = 16 (8-token tile), 48 (wide
    # tile, two gate/up launches; cap: the base tile's launch at 168
    # registers; fp16: the sums in fp16; one_plane: the combine's one h
    # plane, which must follow block 0's demotion at the replay) and 1,
    # eagerly and replayed from a graph after the routing changes (experts
    # over one tile) and block 0 demotes.
    gen = torch.Generator().manual_seed(15)
    t = {8: 16, 16: 48, 1: 1}[block_m]
    ids, new_ids = (torch.stack([torch.randperm(n, generator=gen)[:2] for _ in range(t)]) for n in (8, 3))
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=block_m, split_k=2, use_asm=True,
                     block_m_wide=wide, gate_up_split_stages=split, num_stages=4, gate_up_apart=True,
                     gate_up_interleave=block_m == 8, gate_up_maxnreg=cap, gate_up_sums_fp16=fp16,
                     combine_one_plane=one_plane)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=15, demote_first_block=True, demote_first_down=one_plane)


def test_apart_token_tiles_cover_an_expert_of_every_token():
    from kernels.moe_gate_up import apart_token_tiles

    assert apart_token_tiles(16, 8, 0, 0) == 2  # the 8-token tile at B = 16
    assert apart_token_tiles(64, 16, 0, 16) == 1  # the base-tile launch of a token-class split
    assert apart_token_tiles(64, 32, 0, 0) == 2  # its wide-tile launch
    assert apart_token_tiles(48, 16, 32, 0) == 2  # both tiles in one launch: wide tiles past 16 tokens
    assert apart_token_tiles(3, 16, 0, 0) == 1 and apart_token_tiles(1, 1, 0, 0) == 1
