"""kernels/dense_mma.py against its fp32 reference at irregular shapes (K
not a multiple of the chunk, N not of the rows per program, tokens below,
at and between the token tiles), at two launch shapes, and its input checks.
The interpreter's tl.dot is wrong on bf16 operands (ANCHORS.md), so bf16
runs on a GPU only."""

from __future__ import annotations

import pytest
import torch

from kernels.dense_mma import (MIN_TOKEN_TILE, MMA_MAX_TOKENS, STAGE_SHARED_BUDGET, WIDE_BLOCK_K, MmaTiles,
                               default_tiles, dense_mma, dense_mma_reference, pipeline_stages, token_tile)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def dtypes(device: str) -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16] if device == "cuda" else [torch.float16]


@pytest.mark.parametrize("tokens", [1, 5, 16, 23])
@pytest.mark.parametrize("n,k", [(37, 200), (70, 128)])
def test_matches_reference(device, tokens, n, k):
    for dtype in dtypes(device):
        gen = torch.Generator().manual_seed(tokens * 1000 + n + k)
        x = torch.randn(tokens, k, generator=gen).to(device=device, dtype=dtype)
        w = (torch.randn(n, k, generator=gen) * 0.05).to(device=device, dtype=dtype)
        want = dense_mma_reference(x, w)
        for tiles in (MmaTiles(block_n=16, block_k=64, num_stages=2), MmaTiles(block_n=32, block_k=32)):
            got = dense_mma(x, w, tiles)
            assert got.shape == (tokens, n) and got.dtype == dtype
            assert rel_err(got, want) < (4e-3 if dtype == torch.float16 else 2e-2), (dtype, tiles)


@pytest.mark.parametrize("tokens", [3, 33])
def test_default_tiles_match_reference(device, tokens):
    # No tiles asked: default_tiles(T), both of its shapes (K of 300 is not a
    # multiple of either K chunk).
    x = torch.randn(tokens, 300, device=device, dtype=torch.float16)
    w = torch.randn(72, 300, device=device, dtype=torch.float16) * 0.05
    assert rel_err(dense_mma(x, w), dense_mma_reference(x, w)) < 4e-3


def test_default_tiles_take_shorter_k_chunks_past_the_16_token_tile():
    assert all(default_tiles(t) == MmaTiles() for t in (1, 9, MIN_TOKEN_TILE))
    for t in (MIN_TOKEN_TILE + 1, 40, MMA_MAX_TOKENS):
        tiles = default_tiles(t)
        assert tiles.block_k == WIDE_BLOCK_K and tiles.block_n == MmaTiles().block_n
        assert pipeline_stages(tiles, t, 2) == tiles.num_stages  # every asked stage fits


def test_writes_every_element_and_nothing_else(device):
    # A strided out view: every element of it written (NaN fill gone), the
    # columns around it and the rows past T untouched.
    x = torch.randn(9, 96, device=device, dtype=torch.float16)
    w = torch.randn(40, 96, device=device, dtype=torch.float16) * 0.05
    buf = torch.full((9, 60), float("nan"), device=device, dtype=torch.float16)
    dense_mma(x, w, MmaTiles(block_n=16, block_k=32), out=buf[:, 8:48])
    assert rel_err(buf[:, 8:48], dense_mma_reference(x, w)) < 4e-3
    assert bool(buf[:, :8].isnan().all() and buf[:, 48:].isnan().all())


def test_token_tile():
    assert [token_tile(t) for t in (1, 4, 16, 17, 33, 64)] == [16, 16, 16, 32, 64, 64]


def test_pipeline_stages_fit_the_shared_memory():
    default = MmaTiles()
    assert [pipeline_stages(default, t, 2) for t in (4, 16, 32, 64)] == [5, 5, 4, 3]
    assert pipeline_stages(MmaTiles(block_n=64, block_k=128), 16, 2) == 5  # the asked stages when they fit
    assert pipeline_stages(MmaTiles(block_n=128, block_k=256), 64, 2) == 2
    assert pipeline_stages(MmaTiles(block_n=128, block_k=1024), 64, 4) == 1  # one stage at least
    for t in (1, 16, 17, 64):
        stages = pipeline_stages(default, t, 2)
        assert stages * (default.block_n + token_tile(t)) * default.block_k * 2 <= STAGE_SHARED_BUDGET


def test_rejects_bad_input(device):
    x = torch.randn(2, 128, device=device, dtype=torch.float16)
    w = torch.randn(16, 128, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="tokens"):
        dense_mma(torch.randn(MMA_MAX_TOKENS + 1, 128, device=device, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="share"):
        dense_mma(x.float(), w)
    with pytest.raises(ValueError, match="need x"):
        dense_mma(x, torch.randn(16, 64, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="unit last stride"):
        dense_mma(x, w.t().contiguous().t())
    with pytest.raises(ValueError, match="out must be"):
        dense_mma(x, w, out=torch.empty(2, 9, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="power of two"):
        MmaTiles(block_n=8)
    with pytest.raises(ValueError, match="power of two"):
        MmaTiles(block_k=48)
    with pytest.raises(ValueError, match="num_stages"):
        MmaTiles(num_stages=0)
