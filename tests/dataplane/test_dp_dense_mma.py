"""DataplaneConfig.dense_mma_max_tokens's transform: which projections take the
decode tensor-core kernel (kernels/dense_mma.py), which batch sizes reach it
past the GEMV's, and on a GPU that it gives torch's product."""

from __future__ import annotations

import pytest
import torch

from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build
from dataplane.layers import linear as linear_module
from dataplane.layers.linear import Linear
from dataplane.models.mixtral import MixtralAttention
from dataplane.models.synthetic import build_synthetic
from kernels.dense_mma import MMA_MAX_TOKENS, MmaTiles

TILES = MmaTiles(block_n=32, block_k=128, num_stages=3)


@pytest.mark.parametrize("fuse_first", [False, True])
def test_every_attention_projection_and_nothing_else(fuse_first):
    _, model = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=0)
    if fuse_first:
        model.fuse_qkv()
    model.use_dense_mma(16, TILES)
    if not fuse_first:
        model.fuse_qkv()  # the fused projection keeps the setting
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    projections = [p for a in attention for p in (a.qkv_proj, a.o_proj)]
    assert attention and all(p.mma_max_tokens == 16 and p.mma_tiles == TILES for p in projections)
    others = [m for m in model.modules() if isinstance(m, Linear) and all(m is not p for p in projections)]
    assert others and all(m.mma_max_tokens == 0 for m in others)  # the LM head stays on torch


def test_config_bound_is_the_kernel_s():
    field = DataplaneConfig.model_fields["dense_mma_max_tokens"]
    assert max(m.le for m in field.metadata if hasattr(m, "le")) == MMA_MAX_TOKENS
    with pytest.raises(ValueError):
        DataplaneConfig(dense_mma_max_tokens=MMA_MAX_TOKENS + 1)


@pytest.mark.parametrize("max_tokens", [0, 16])
def test_builder_applies_the_config(max_tokens):
    config = DataplaneConfig(synthetic="mixtral-tiny", device="cpu", dense_mma_max_tokens=max_tokens)
    model = build(config).engine.runner.model
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    assert attention and all(a.qkv_proj.mma_max_tokens == max_tokens and a.o_proj.mma_max_tokens == max_tokens
                             for a in attention)


def test_batch_sizes_reach_the_kernel_meant_for_them(monkeypatch):
    # Which product each batch size takes, with the CUDA test stubbed out:
    # the GEMV up to its bound, this kernel past it up to its own, torch after.
    calls = []
    monkeypatch.setattr(linear_module, "dense_gemv", lambda x, w, tiles, pdl: calls.append(("gemv", x.shape[0])))
    monkeypatch.setattr(linear_module, "dense_mma", lambda x, w, tiles, pdl: calls.append(("mma", x.shape[0])))
    monkeypatch.setattr(Linear, "_kernel_suits", lambda self, x: True)
    lin = Linear(32, 8, torch.device("cpu"), torch.float16)
    torch.nn.init.normal_(lin.weight)
    lin.gemv_max_tokens, lin.mma_max_tokens = 1, 16
    for tokens in (1, 2, 16, 17):
        lin(torch.zeros(tokens, 32, dtype=torch.float16))
    assert calls == [("gemv", 1), ("mma", 2), ("mma", 16)]  # 17 rows: torch's product


def test_off_the_gpu_the_product_is_torch_s():
    lin = Linear(256, 24, torch.device("cpu"), torch.float32)
    torch.nn.init.normal_(lin.weight)
    lin.mma_max_tokens = MMA_MAX_TOKENS
    x = torch.randn(8, 256)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tiles", [None, TILES])
def test_gpu_projection_matches_torch(tiles):
    lin = Linear(1024, 640, torch.device("cuda"), torch.bfloat16)
    torch.nn.init.normal_(lin.weight, std=0.03)
    lin.gemv_max_tokens, lin.mma_max_tokens, lin.mma_tiles = 1, 16, tiles
    for tokens in (2, 5, 16, 17):
        x = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
        want = torch.nn.functional.linear(x, lin.weight)
        got = lin(x)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        assert err < 1e-2, (tokens, err)
        if tokens > 16:
            assert torch.equal(got, want)  # torch's own product
