"""kernels/dense_gemv.py against its fp32 reference at irregular shapes (K
not a multiple of the chunk, N not of the rows per program, 1-4 tokens),
at two launch shapes, and its input checks."""

from __future__ import annotations

import pytest
import torch

from kernels.dense_gemv import GEMV_MAX_TOKENS, GemvTiles, dense_gemv, dense_gemv_reference


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(37, 300), (8, 1024), (100, 640)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_reference(device, tokens, n, k, dtype):
    gen = torch.Generator().manual_seed(tokens * 1000 + n + k)
    x = torch.randn(tokens, k, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(device=device, dtype=dtype)
    want = dense_gemv_reference(x, w)
    for tiles in (GemvTiles(block_k=256), GemvTiles(block_k=128, block_n=16)):
        got = dense_gemv(x, w, tiles)
        assert got.shape == (tokens, n) and got.dtype == dtype
        assert rel_err(got, want) < (4e-3 if dtype == torch.float16 else 2e-2), tiles


def test_writes_into_a_strided_out_buffer(device):
    x = torch.randn(2, 256, device=device, dtype=torch.float16)
    w = torch.randn(24, 256, device=device, dtype=torch.float16) * 0.05
    buf = torch.full((2, 40), 7.0, device=device, dtype=torch.float16)
    dense_gemv(x, w, out=buf[:, 8:32])
    assert rel_err(buf[:, 8:32], dense_gemv_reference(x, w)) < 4e-3
    assert bool((buf[:, :8] == 7).all() and (buf[:, 32:] == 7).all())  # nothing outside it


def test_rejects_bad_input(device):
    x = torch.randn(1, 128, device=device, dtype=torch.float16)
    w = torch.randn(8, 128, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="tokens"):
        dense_gemv(torch.randn(GEMV_MAX_TOKENS + 1, 128, device=device, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="share"):
        dense_gemv(x.float(), w)
    with pytest.raises(ValueError, match="need x"):
        dense_gemv(x, torch.randn(8, 64, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="unit last stride"):
        dense_gemv(x, w.t().contiguous().t())
    with pytest.raises(ValueError, match="out must be"):
        dense_gemv(x, w, out=torch.empty(1, 9, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="power of two"):
        GemvTiles(block_n=12)
    with pytest.raises(ValueError, match="num_stages"):
        GemvTiles(num_stages=0)
