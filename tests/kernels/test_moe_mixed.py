"""Fused mixed-precision MoE kernels against the plain-torch reference."""

import pytest
import torch

from kernels import moe_align, moe_down, moe_gate_up, moe_mixed
from kernels import weight_layout as wl
from kernels.moe_align import moe_prepare, moe_prepare_reference
from kernels.moe_mixed import (
    alloc_workspace,
    dequantized_block,
    fused_moe_mixed,
    moe_mixed_reference,
    run_gate_up,
)
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import MoeTuning
from kernels.smem_carveout import carveout_of
from tests.kernels.mixed_layer import E, F, H, PAGE, check_eager_and_replay, check_two_expert_layer, mixed_fields, \
    rel_err
from tests.kernels.paged_store import random_moe


@pytest.mark.parametrize("bn_up,split,balance,block_m", [(128, 2, True, 16), (64, 3, True, 16), (128, 2, False, 16),
                                                        (64, 3, False, 16), (128, 2, True, 1), (64, 3, False, 1),
                                                        (128, 2, True, 8), (64, 3, False, 8)])
def test_mixed_bits_in_one_launch(device, bn_up, split, balance, block_m):
    # balance: the down launch shares each row tile's work by view cost, so
    # programs start and end inside an expert's K range; else equal K splits.
    # block_m 1: the CUDA-core product, one token per tile (here up to 6 tiles
    # per expert); 8: mma.sync, its activation rows in moe_decode.tile_k_order.
    weights = random_moe(2, E, H, F, mixed_fields, PAGE, device, seed=3)
    torch.manual_seed(4)
    t = 6
    x = torch.randn(t, H)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(t)])  # experts 0..3, 4 is host-only
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=bn_up, block_n_down=128, block_m=block_m, split_k=split, balance_down=balance)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 1, E, F)
    assert out.shape == (t, H) and bool(torch.isfinite(out).all())
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("bits", wl.VIEW_BITS)
def test_narrow_tile_each_view_over_two_token_tiles(device, bits):
    # The 8-token tile (mma.sync; kernels/moe_decode.tile_k_order) on every
    # view alone, with expert 1 over one tile (11 tokens: a full tile and a
    # masked one), against the fp32 reference.
    nf = wl.VIEW_BITS.index(bits) + 1
    weights = random_moe(1, E, H, F, lambda l, e, p: nf, PAGE, device, seed=11)
    torch.manual_seed(12)
    t = 11
    x = torch.randn(t, H)
    ids = torch.stack([torch.tensor([1, int(i)]) for i in torch.randint(2, 4, (t,))])
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=8, split_k=2)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F)
    assert bool(torch.isfinite(out).all()) and rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("bits", wl.VIEW_BITS)
def test_cuda_core_tile_each_view(device, bits):
    # Every view's code bytes and class places (kernels/moe_cuda_core.py) on
    # their own, 64- and 128-row tiles, against the fp32 reference.
    nf = wl.fields_for_bits(bits)
    weights = random_moe(1, 3, H, F, lambda l, e, p: nf, PAGE, device, seed=20 + nf)
    torch.manual_seed(21)
    x = torch.randn(2, H)
    x[1, :64] *= 100  # one span far larger than the others
    ids = torch.tensor([[0, 2], [1, 2]])
    tw = torch.rand(2, 2)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, 3, F)
    for rows, rows_per_thread in ((64, 1), (128, 1), (128, 2)):
        tiles = MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=2,
                         num_warps=rows // (32 * rows_per_thread))
        out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, 3, F, tiles)
        assert rel_err(out, ref) < 3e-3, (bits, rows, rows_per_thread)


def test_scale_words_across_page_breaks(device):
    # With H=384, F=640 and 16 KiB pages every view has a 64-row tile whose
    # (scale, offset) words straddle a page (e.g. the down blocks' scales
    # start 12 KiB into a page, 1280 bytes per tile: tile 3 spans the break),
    # so the K loop must switch page bases inside that tile's group range.
    # (PAGE above never breaks a tile's scales.)
    h, f, e, page = 384, 640, 3, 16384
    weights = random_moe(1, e, h, f, lambda l, x, p: [5, 2, 1, 3, 4, 5, 2, 3, 1][3 * x + p], page, device, seed=11)
    torch.manual_seed(12)
    t = 5
    x = torch.randn(t, h)
    ids = torch.stack([torch.randperm(e)[:2] for _ in range(t)])
    tw = torch.rand(t, 2)
    for balance in (True, False):
        tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=2, balance_down=balance)
        out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, e, f, tiles)
        ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, e, f)
        assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("t,block_m,wide,balance,split,down_split", [
    (20, 16, 0, False, 0, 0), (20, 16, 32, False, 0, 0), (40, 16, 32, False, 0, 0), (40, 16, 32, True, 0, 0),
    (40, 16, 32, False, 2, 0), (40, 16, 32, False, 2, 2), (40, 16, 32, False, 0, 3), (20, 8, 0, False, 0, 0),
    (40, 8, 0, True, 0, 0)])
def test_few_experts_host_only_and_token_loop(device, t, block_m, wide, balance, split, down_split):
    # t tokens on two experts (more than one token tile each: several tiles,
    # one wide tile, or several wide tiles), one slot routed to a host-only
    # expert, one slot ignored (-1). block_m 8: 2-5 narrow tiles an expert.
    # split / down_split: gate/up / down in two launches, one per token class
    # (t = 40: experts of 39 and 30 tokens on the wide tile, of 10 and 1 on
    # the base tile).
    check_two_expert_layer(device, t, MoeTiles(block_n_up=128, block_n_down=128, block_m=block_m, split_k=1,
                                               block_m_wide=wide, balance_down=balance, gate_up_split_stages=split,
                                               down_split_stages=down_split))


@pytest.mark.parametrize("block_m,balance", [(16, True), (16, False), (1, True), (1, False)])
def test_stale_slots_past_num_active_are_ignored(device, monkeypatch, block_m, balance):
    # Both launches read a slot's expert id before num_active (moe_paged.slot_expert):
    # the prep writes only the active slots, so the others hold whatever the
    # buffer held. Out-of-range ids there must neither fault nor count.
    weights = random_moe(1, E, H, F, mixed_fields, PAGE, device, seed=8)
    torch.manual_seed(9)
    x = torch.randn(2, H).to(torch.float16)
    ids = torch.tensor([[3, 1], [1, 3]])  # 4 slots, 2 active experts
    tw = torch.rand(2, 2)
    prepare = moe_mixed.moe_prepare

    def prepare_then_scribble(*args, **kwargs):
        prep = args[3]
        prepare(*args, **kwargs)
        n_act = int(prep.num_active[0])
        assert n_act == 2
        prep.active[n_act:] = torch.tensor([2 ** 30, -7, 2 ** 31 - 1], dtype=torch.int32)[: E - n_act]

    monkeypatch.setattr(moe_mixed, "moe_prepare", prepare_then_scribble)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=block_m, split_k=2, balance_down=balance,
                     num_warps=4)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F)
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("block_m,interleave", [(16, False), (8, False), (1, False), (16, True), (1, True)])
def test_gate_up_writes_every_routed_row(device, block_m, interleave):
    # block_m 1: the CUDA-core tile, h quantized to int16 per span of 64 rows.
    # interleave: the grid row tile major (MoeTiles.gate_up_interleave).
    weights = random_moe(1, E, H, F, lambda l, e, p: 1 + (e + p) % 5, PAGE, device, seed=7)
    torch.manual_seed(8)
    t, k = 5, 2
    x = torch.randn(t, H)
    ids = torch.tensor([[0, 3], [3, 1], [1, 0], [4, 3], [2, 4]])
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=block_m, split_k=1,
                     num_warps=2 if block_m == 1 else 4, gate_up_interleave=interleave)
    assert ws_dtype_of(tiles) == (torch.int16 if block_m == 1 else torch.float16)
    ws = alloc_workspace(t, k, H, F, E, tiles, device)
    for buf in (ws.prep.xsum, ws.prep.out, ws.prep.xq_scale, ws.hsum, ws.hq_scale):
        buf.fill_(float("nan"))
    for buf in (ws.prep.x_planes, ws.h_planes):
        buf.fill_(float("nan") if block_m > 1 else -(2**15))  # -2^15: outside the int16 codes
    prep = moe_prepare(x.to(device), ids.to(device), E, ws.prep)
    assert bool((prep.out == 0).all()) and bool(torch.isfinite(prep.xp.float()).all())
    run_gate_up(ws, weights, 0, E, k, F, tiles, PAGE.bit_length() - 1)
    order = prep.sorted_ids.cpu().long()
    assert bool(torch.isfinite(ws.hsum).all())
    narrow = tiles.narrow_order  # h in the narrow tile's slot order
    idx = wl.virtual_to_actual()[wl.slot_virtual(narrow)]
    cols = (torch.arange(F // 128)[:, None] * 128 + idx[None, :]).reshape(-1)
    for pos, flat in enumerate(order.tolist()):
        tok, e = flat // k, int(ids.view(-1)[flat])
        w1 = dequantized_block(weights, e * 3, F, H).cpu()
        w3 = dequantized_block(weights, e * 3 + 1, F, H).cpu()
        xe = x[tok].to(torch.float16).float()
        href = torch.nn.functional.silu(xe @ w1.T) * (xe @ w3.T)
        if block_m == 1:
            q, scale = ws.h[pos].cpu(), ws.hq_scale[pos].cpu()
            assert int(q.abs().max()) <= wl.ACT_QMAX  # every code written
            # each span's largest |h| is the largest code
            spans = wl.dequantize_activations(q, torch.ones_like(scale)).reshape(-1, wl.ACT_SPAN)
            assert torch.equal(spans.abs().amax(-1), torch.full((F // wl.ACT_SPAN,), float(wl.ACT_QMAX)))
            got = wl.dequantize_activations(q, scale)
        else:
            assert bool(torch.isfinite(ws.h_planes).all())
            got = torch.empty(F)
            got[cols] = ws.h[pos].float().cpu()
        assert rel_err(got, href) < 2e-3
        sums = got.reshape(-1, 64).sum(-1)  # tiles are 64 actual rows of F
        assert torch.allclose(ws.hsum[pos].cpu(), sums, rtol=1e-3, atol=1e-3)
        if block_m > 1:
            # h rounded to fp16; the planes the 3/4-bit and 2-bit decodes
            # read: h at each slot times 2^-p (exactly: powers of two).
            for plane in (1, 2):
                scaled = (ws.h[pos].float().cpu().reshape(-1, 128) * wl.plane_scales(plane, narrow)).to(ws.h.dtype)
                assert torch.equal(ws.h_planes[plane, pos].cpu(), scaled.reshape(-1))


@pytest.mark.parametrize("keep", ["narrow", "wide"])
def test_split_gate_up_launches_take_one_token_class_each(device, monkeypatch, keep):
    # MoeTiles.gate_up_split_stages: with only one of the two launches run,
    # h holds exactly that class's experts (base tile: at most block_m
    # tokens; wide tile: over it) and nothing of the other's.
    weights = random_moe(1, E, H, F, lambda l, e, p: [2, 5, 3][p], PAGE, device, seed=9)
    torch.manual_seed(10)
    t, k = 24, 2
    x = torch.randn(t, H)
    ids = torch.tensor([[0, 1]] * t)
    ids[:5, 1] = 3  # expert 0: 24 tokens (wide), 1: 19 (wide), 3: 5 (base)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=1, block_m_wide=32,
                     gate_up_split_stages=2)
    launch = moe_gate_up._launch_gate_up

    def one_class(*args):
        tokens_hi = args[-1]
        if (tokens_hi > 0) == (keep == "narrow"):
            launch(*args)

    monkeypatch.setattr(moe_gate_up, "_launch_gate_up", one_class)
    ws = alloc_workspace(t, k, H, F, E, tiles, device)
    ws.h_planes.fill_(float("nan"))
    prep = moe_prepare(x.to(device), ids.to(device), E, ws.prep)
    run_gate_up(ws, weights, 0, E, k, F, tiles, PAGE.bit_length() - 1)
    experts = ids.view(-1)[prep.sorted_ids.cpu().long()]
    written = torch.isfinite(ws.h.float().cpu()).all(-1)
    assert not bool(torch.isfinite(ws.h.float().cpu()[~written]).any())  # whole rows or none
    assert torch.equal(written, (experts == 3) == (keep == "narrow"))


@pytest.mark.parametrize("keep", ["narrow", "wide"])
def test_split_down_launches_take_one_token_class_each(device, monkeypatch, keep):
    # MoeTiles.down_split_stages: with only one of the two down launches
    # run, the output is the layer of that class's experts alone (the other
    # class's routes ignored) -- base tile: at most block_m tokens.
    weights = random_moe(1, E, H, F, lambda l, e, p: [2, 5, 3][p], PAGE, device, seed=11)
    torch.manual_seed(12)
    t = 24
    x = torch.randn(t, H).to(torch.float16)
    ids = torch.tensor([[0, 1]] * t)
    ids[:5, 1] = 3  # expert 0: 24 tokens (wide), 1: 19 (wide), 3: 5 (base)
    tw = torch.rand(t, 2)
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=2, block_m_wide=32,
                     down_split_stages=2)
    launch = moe_down._launch_down

    def one_class(*args):
        if (args[-1] > 0) == (keep == "narrow"):  # tokens_hi: the base tile's launch
            launch(*args)

    monkeypatch.setattr(moe_down, "_launch_down", one_class)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, tiles)
    kept = torch.where((ids == 3) == (keep == "narrow"), ids, torch.full_like(ids, -1))
    ref = moe_mixed_reference(x.to(device), kept.to(device), tw.to(device), weights, 0, E, F)
    assert rel_err(out, ref) < 3e-3


def ws_dtype_of(tiles):
    ws = alloc_workspace(1, 2, H, F, E, tiles, "meta")
    assert ws.prep.x_planes.dtype == ws.h_planes.dtype == tiles.activation_dtype
    return ws.h_planes.dtype


@pytest.mark.parametrize("in_kernel_sort,plane_dtype,with_cost,narrow", [
    (True, torch.float16, False, False), (False, torch.float16, False, False), (True, torch.int16, False, False),
    (True, torch.float16, True, False), (False, torch.float16, True, False), (True, torch.float16, False, True)])
def test_prepare_matches_reference(device, monkeypatch, in_kernel_sort, plane_dtype, with_cost, narrow):
    # narrow: the fp16 planes in the 8-token tile's slot order.
    if not in_kernel_sort:
        monkeypatch.setattr(moe_align, "MAX_PAIRS_IN_KERNEL", 4)
    torch.manual_seed(9)
    t, k, e = 7, 3, 6
    # 11 groups: a full chunk of moe_align.GROUPS_PER_STEP and a partial one per row
    h = 11 * wl.GROUP
    x = torch.randn(t, h, dtype=torch.bfloat16)
    x[0, 0] = 1e6  # clamped to fp16 max
    ids = torch.randint(0, e, (t, k))
    ids[2, 1] = -1
    x[1, 5] = 1e-6  # times 2^-p: an fp16 subnormal
    x[3, 64:128] = 0  # a span of zeros: scale 0
    prep = moe_align.alloc_prep(t, k, h, e, device, plane_dtype, narrow)
    for buf in (prep.xsum, prep.out, prep.xq_scale):
        buf.fill_(float("nan"))  # every element must be written
    prep.x_planes.fill_(float("nan") if plane_dtype == torch.float16 else -(2**15))
    # slot_cost as fused_moe_mixed passes it: a strided view (the down blocks'
    # field counts), ties included
    fields = torch.tensor([[0, 0, 2], [0, 0, 5], [0, 0, 2], [0, 0, 1], [0, 0, 5], [0, 0, 3]], dtype=torch.int32)
    cost = fields.reshape(-1)[2::3] if with_cost else None
    got = moe_prepare(x.to(device), ids.to(device), e, prep, None if cost is None else cost.to(device))
    ref = moe_prepare_reference(x, ids, e, plane_dtype, cost, narrow)
    assert torch.equal(got.out.cpu(), ref.out)
    if plane_dtype == torch.float16:
        assert torch.equal(got.x_planes.cpu(), ref.x_planes)
    else:
        # the kernel's product and rounding may fuse: codes within one
        assert int((got.x_planes.cpu().int() - ref.x_planes.int()).abs().max()) <= 1
        assert torch.equal(got.xq_scale.cpu(), ref.xq_scale)
        assert float(ref.xq_scale[3, 1]) == 0 and not bool(got.x_planes[0, 3, 64:128].any())
    assert torch.allclose(got.xsum.cpu(), ref.xsum, rtol=1e-5, atol=1e-3)
    assert torch.equal(got.sorted_ids[: int(ref.offsets[-1])].cpu(), ref.sorted_ids[: int(ref.offsets[-1])])
    assert torch.equal(got.offsets.cpu(), ref.offsets)
    n = int(ref.num_active)
    assert int(got.num_active) == n and torch.equal(got.active[:n].cpu(), ref.active[:n])
    active = ref.active[:n].tolist()
    assert sorted(active) == sorted(set(ids[ids >= 0].tolist()))
    if with_cost:  # costliest first, ties by id
        keys = [(-int(cost[a]), a) for a in active]
        assert keys == sorted(keys) and active != sorted(active)
    else:
        assert active == sorted(active)


def test_workspace_must_match_the_tiles(device):
    weights = random_moe(1, E, H, F, lambda l, e, p: 3, PAGE, device, seed=2)
    x = torch.randn(1, H, device=device)
    ids = torch.tensor([[1]], device=device)  # one pair: one token tile on either tile
    tw = torch.ones(1, 1, device=device)
    tensor_core = MoeTiles(block_m=16, split_k=1)
    cuda_core = MoeTiles(block_m=1, split_k=1)
    narrow = MoeTiles(block_m=8, split_k=1)  # fp16 planes as the 16-token tile's, in another slot order
    for alloc_for, run_with in ((tensor_core, cuda_core), (cuda_core, tensor_core), (narrow, tensor_core),
                                (tensor_core, narrow)):
        ws = alloc_workspace(1, 1, H, F, E, alloc_for, device)
        with pytest.raises(ValueError, match="allocate the workspace for these tiles"):
            fused_moe_mixed(x, ids, tw, weights, 0, E, F, run_with, ws)
    ws = alloc_workspace(1, 1, H, F, E, cuda_core, device)
    out = fused_moe_mixed(x, ids, tw, weights, 0, E, F, cuda_core, ws)
    assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, 0, E, F)) < 3e-3


def test_rejects_small_pages(device):
    weights = random_moe(1, 2, 128, 1024, lambda l, e, p: 1, 128, device)
    x = torch.randn(1, 128, device=device)
    ids = torch.zeros(1, 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="page_bytes"):
        fused_moe_mixed(x, ids, torch.ones(1, 1, device=device), weights, 0, 2, 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("use_asm,stages", [(False, 3), (True, 3), (True, MoeTuning().tensor_core_stages)])
def test_gpu_larger_shapes_and_graph_replay(use_asm, stages):
    gen = torch.Generator().manual_seed(10)
    ids, new_ids = (torch.randint(0, 8, (33, 2), generator=gen) for _ in range(2))
    tiles = MoeTiles(block_n_up=64, block_n_down=128, block_m=16, split_k=4, use_asm=use_asm, num_stages=stages)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=10, demote_first_block=True)


@pytest.mark.gpu
@pytest.mark.parametrize("stages,balance,maxnreg", [(4, True, None), (6, True, None), (4, False, None),
                                                   (4, True, 168), (3, True, 128)])
def test_gpu_narrow_tile_and_replay(stages, balance, maxnreg):
    # The 8-token tile (mma.sync, its planes in the narrow slot order) as
    # choose_tiles builds it for B <= 16; 16 tokens on 8 experts, then on 4,
    # so that experts have more than one narrow tile's tokens after the
    # replay's new routing. Also under the register caps MoeTuning's
    # narrow_tile_maxnreg is measured at (their spills sit outside the loops).
    gen = torch.Generator().manual_seed(14)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(16)])
    new_ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(16)])
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=8, split_k=4, use_asm=True,
                     num_stages=stages, balance_down=balance, maxnreg=maxnreg)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=14, demote_first_block=True)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,stages,rows_per_thread,split", [(128, 3, 1, 4), (64, 3, 1, 4), (128, 7, 1, 4),
                                                               (128, 4, 2, 4), (128, 4, 1, 6)])
def test_gpu_cuda_core_tile_one_token_and_replay(rows, stages, rows_per_thread, split):
    # The one-token launches as choose_tiles builds them (one or two rows per
    # thread); the captured step replays with other experts and a demoted
    # block. 7 stages: over 100 KiB of shared memory per program. Split 6:
    # the down launch's 11 groups in ranges of 1-2, its carveout by its
    # registers (MoeTuning.one_token_down_programs).
    gen = torch.Generator().manual_seed(13)
    ids, new_ids = (torch.randperm(8, generator=gen)[:2][None] for _ in range(2))
    tiles = MoeTiles(block_n_up=rows, block_n_down=rows, block_m=1, split_k=split, use_asm=True,
                     num_warps=rows // (32 * rows_per_thread), num_stages=stages,
                     maxnreg=255 if rows_per_thread > 1 else None, down_by_registers=split > 4)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=13, demote_first_block=True)


@pytest.mark.gpu
@pytest.mark.parametrize("wide,stages,wide_stages,split,down_split", [(0, 3, 0, 0, 0), (32, 3, 0, 0, 0),
                                                                        (32, 4, 3, 0, 0), (32, 3, 3, 4, 0),
                                                                        (32, 3, 3, 4, 4)])
def test_gpu_loaded_experts_with_and_without_wide_tile(wide, stages, wide_stages, split, down_split):
    # 48 tokens on 3 of 8 experts (30-35 tokens each: one or two wide tiles,
    # two or three narrow ones), then on 4 (16-27 each: both token classes);
    # then the two tiles' loops at different pipeline depths in one launch;
    # last, gate/up (and down) as two launches, one per token class.
    gen = torch.Generator().manual_seed(11)
    ids, new_ids = (torch.stack([torch.randperm(n, generator=gen)[:2] for _ in range(48)]) for n in (3, 4))
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=2, use_asm=True, block_m_wide=wide,
                     num_stages=stages, wide_stages=wide_stages, gate_up_split_stages=split,
                     down_split_stages=down_split)
    check_eager_and_replay("cuda", tiles, ids, new_ids, seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("wide,stages", [(0, 3), (32, 3), (0, 4)])
def test_gpu_carveout_limited_only_for_launches_over_48k(wide, stages):
    # At 3 stages the wide build needs 58 KiB of shared memory per program,
    # the narrow one 46 KiB; at 4 stages the narrow one 67 KB: only those
    # over 48 KiB get an explicit (partial) carveout.
    gen = torch.Generator().manual_seed(12)
    ids = torch.stack([torch.randperm(3, generator=gen)[:2] for _ in range(48)])
    tiles = MoeTiles(block_n_up=128, block_n_down=128, block_m=16, split_k=2, use_asm=True, block_m_wide=wide,
                     num_stages=stages)
    ws = alloc_workspace(48, 2, 1024, 1408, 8, tiles, "cuda")
    check_eager_and_replay("cuda", tiles, ids, ids, seed=12, workspace=ws)
    assert len(ws.carveouts_set) == 2
    got = sorted(carveout_of(f) for f in ws.carveouts_set)
    if wide or stages > 3:
        assert all(0 < c < 100 for c in got), got
    else:
        assert got == [-1, -1]
