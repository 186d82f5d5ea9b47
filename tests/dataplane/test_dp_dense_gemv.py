"""DataplaneConfig.dense_gemv_max_tokens's transform: which projections take the decode
GEMV kernel (kernels/dense_gemv.py), and on a GPU that they give torch's
product for 1-4 tokens and hand larger batches to torch."""

from __future__ import annotations

import pytest
import torch

from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build
from dataplane.layers.linear import Linear
from dataplane.models.mixtral import O_PROJ_GEMV_TILES, MixtralAttention
from dataplane.models.synthetic import build_synthetic
from kernels.dense_gemv import GEMV_MAX_TOKENS


@pytest.mark.parametrize("fuse_first", [False, True])
def test_every_attention_projection_and_nothing_else(fuse_first):
    _, model = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=0)
    if fuse_first:
        model.fuse_qkv()
    model.use_dense_gemv(GEMV_MAX_TOKENS)
    if not fuse_first:
        model.fuse_qkv()  # the fused projection keeps the setting
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    assert attention and all(a.qkv_proj.gemv_max_tokens == GEMV_MAX_TOKENS for a in attention)
    assert all(a.o_proj.gemv_max_tokens == GEMV_MAX_TOKENS for a in attention)
    assert all(a.o_proj.gemv_tiles == O_PROJ_GEMV_TILES and a.qkv_proj.gemv_tiles is None for a in attention)
    in_attention = {id(p) for a in attention for p in (a.qkv_proj, a.o_proj)}
    others = [m for m in model.modules() if isinstance(m, Linear) and id(m) not in in_attention]
    assert all(m.gemv_max_tokens == 0 for m in others)  # the LM head stays on torch


def test_config_bound_is_the_kernel_s():
    field = DataplaneConfig.model_fields["dense_gemv_max_tokens"]
    assert max(m.le for m in field.metadata if hasattr(m, "le")) == GEMV_MAX_TOKENS
    with pytest.raises(ValueError):
        DataplaneConfig(dense_gemv_max_tokens=GEMV_MAX_TOKENS + 1)


@pytest.mark.parametrize("max_tokens", [0, 2])
def test_builder_applies_the_config(max_tokens):
    config = DataplaneConfig(synthetic="mixtral-tiny", device="cpu", dense_gemv_max_tokens=max_tokens)
    model = build(config).engine.runner.model
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    assert attention and all(a.qkv_proj.gemv_max_tokens == max_tokens and a.o_proj.gemv_max_tokens == max_tokens
                             for a in attention)


def test_off_the_gpu_the_product_is_torch_s():
    lin = Linear(256, 24, torch.device("cpu"), torch.float32)
    torch.nn.init.normal_(lin.weight)
    lin.gemv_max_tokens = GEMV_MAX_TOKENS
    x = torch.randn(2, 256)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tiles", [None, O_PROJ_GEMV_TILES])
def test_gpu_projection_matches_torch(tiles):
    lin = Linear(1024, 640, torch.device("cuda"), torch.bfloat16)
    torch.nn.init.normal_(lin.weight, std=0.03)
    lin.gemv_max_tokens = GEMV_MAX_TOKENS
    lin.gemv_tiles = tiles
    for tokens in range(1, GEMV_MAX_TOKENS + 2):
        x = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
        want = torch.nn.functional.linear(x, lin.weight)
        got = lin(x)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        assert err < 1e-2, (tokens, err)
        if tokens > GEMV_MAX_TOKENS:
            assert torch.equal(got, want)  # torch's own product
