"""kernels/dense_gemv.py against its fp32 reference at irregular shapes (K
not a multiple of the chunk, N not of the rows per program, 1-4 tokens),
at two launch shapes, and its input checks."""

from __future__ import annotations

import pytest
import torch

from kernels.dense_gemv import GEMV_MAX_TOKENS, THREADS_PER_WARP, WARM_CHUNK_BYTES, GemvTiles, dense_gemv, \
    dense_gemv_reference, warm_slots


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


@pytest.mark.parametrize("warm_bytes", [16, 1776, 3 * WARM_CHUNK_BYTES + 48, 13 * 20 * WARM_CHUNK_BYTES])
def test_warming_the_l2_leaves_the_result_as_it_is(device, warm_bytes):
    # 13 programs of 8 rows: the largest warm needs 20 chunks a program; on
    # the GPU the prefetches run (a bad address would fault), on the CPU the
    # interpreter skips them.
    x = torch.randn(2, 640, device=device, dtype=torch.bfloat16)
    w = torch.randn(100, 640, device=device, dtype=torch.bfloat16) * 0.05
    warm = torch.randn(warm_bytes // 2, device=device, dtype=torch.bfloat16)
    before = warm.clone()
    got = dense_gemv(x, w, GemvTiles(block_k=128), warm=warm)
    assert torch.equal(got, dense_gemv(x, w, GemvTiles(block_k=128)))
    assert torch.equal(warm, before)
    if device == "cuda":
        torch.cuda.synchronize()


def test_warm_slots_cover_the_tensor():
    for nbytes, programs in ((16, 1), (4096, 1), (4097 + 15, 3), (33554432, 768), (65536, 512)):
        slots = warm_slots(nbytes, programs)
        assert slots * programs * WARM_CHUNK_BYTES >= nbytes
        assert (slots - 1) * programs * WARM_CHUNK_BYTES < nbytes


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
    with pytest.raises(ValueError, match="multiple of 16"):
        dense_gemv(x, w, warm=torch.empty(3, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        dense_gemv(x, w, warm=torch.empty(8, 16, device=device, dtype=torch.float16).t())
    threads = GemvTiles().num_warps * THREADS_PER_WARP
    with pytest.raises(ValueError, match="can ask for"):
        # One program (8 rows): one chunk a thread at most.
        dense_gemv(x, w, warm=torch.empty((threads * WARM_CHUNK_BYTES + 16) // 2, device=device,
                                          dtype=torch.float16))
    with pytest.raises(ValueError, match="power of two"):
        GemvTiles(block_n=12)
    with pytest.raises(ValueError, match="num_stages"):
        GemvTiles(num_stages=0)
