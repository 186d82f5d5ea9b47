"""What the fused MoE launches allocate, and workspace_bytes' count of it."""

import torch

from dataplane.config import DataplaneConfig
from dataplane.engine_builder import estimate_workspace_bytes
from dataplane.models.mixtral import MixtralSpec
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_workspace import alloc_workspace, workspace_bytes


def allocated_bytes(ws) -> int:
    tensors = [ws.gu, ws.counts, ws.h_planes, ws.hsum, ws.hq_scale, ws.down_plan, ws.prep.x_planes, ws.prep.xsum,
               ws.prep.xq_scale, ws.prep.out, ws.prep.sorted_ids, ws.prep.offsets, ws.prep.active,
               ws.prep.num_active]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def test_count_matches_a_real_allocation():
    for t, k, h, f, e in [(3, 2, 256, 384, 5), (64, 2, 512, 1408, 8), (1, 4, 256, 128, 60)]:
        tiles = choose_tiles(t, k, e, h, f)
        assert workspace_bytes(t, k, h, f, e, tiles) == allocated_bytes(alloc_workspace(t, k, h, f, e, tiles, "cpu"))


def test_planes_share_one_buffer_and_odd_shapes_count_nothing():
    ws = alloc_workspace(4, 2, 256, 384, 5, choose_tiles(4, 2, 5, 256, 384), "cpu")
    for first, planes in ((ws.h, ws.h_planes), (ws.prep.xp, ws.prep.x_planes)):
        assert planes.shape == (3, *first.shape) and planes.is_contiguous()
        assert first.data_ptr() == planes.data_ptr()
    one = alloc_workspace(1, 2, 256, 384, 5, choose_tiles(1, 2, 5, 256, 384), "cpu")  # the CUDA-core tile
    for first, planes in ((one.h, one.h_planes), (one.prep.xp, one.prep.x_planes)):
        assert planes.shape == (1, *first.shape) and planes.dtype == torch.int16
        assert first.data_ptr() == planes.data_ptr()
    assert workspace_bytes(4, 2, 200, 384, 5) == 0 and workspace_bytes(0, 2, 256, 384, 5) == 0


def test_step_estimate_covers_the_fused_scratch():
    # Mixtral-8x7B shapes: the fused kernels' scratch (fp32 gate/up, three h
    # planes) is about twice the torch path's three bf16 intermediates.
    spec = MixtralSpec(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, head_dim=128, num_experts=8, top_k=2, rms_norm_eps=1e-5,
                       rope_theta=1e6, max_position_embeddings=32768)
    config = DataplaneConfig(model_path="unused", max_batched_tokens=512)
    fused = workspace_bytes(512, 2, 4096, 14336, 8)
    assert fused > 512 * 2 * 3 * 14336 * 2
    assert estimate_workspace_bytes(spec, config, torch.bfloat16) >= fused + 512 * 8 * 4096 * 2
