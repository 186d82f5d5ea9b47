"""Skinny (decode) linear kernel against its fp32 torch reference."""

import pytest
import torch

from kernels.skinny_linear import (
    STAGE_BYTES_BUDGET,
    SkinnyTiles,
    choose_skinny_tiles,
    skinny_linear,
    skinny_linear_reference,
    stage_bytes,
)

TOL = dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,n,k,tiles", [
    (1, 50, 96, SkinnyTiles(block_t=16, block_n=16, block_k=32)),  # K not a multiple of BK: masked tail
    (3, 37, 64, SkinnyTiles(block_t=16, block_n=32, block_k=32)),  # N past the last tile
    (19, 70, 160, SkinnyTiles(block_t=16, block_n=16, block_k=64)),  # two token tiles, ragged
])
def test_skinny_linear_matches_reference(device, dtype, t, n, k, tiles):
    torch.manual_seed(t)
    x = torch.randn(t, k).to(device, dtype)
    w = (torch.randn(n, k) / k**0.5).to(device, dtype)
    got = skinny_linear(x, w, tiles=tiles)
    assert got.shape == (t, n) and got.dtype == dtype
    assert torch.isfinite(got).all()  # every element written (torch.empty holds garbage)
    torch.testing.assert_close(got.float().cpu(), skinny_linear_reference(x, w).float().cpu(), **TOL)


def test_skinny_linear_float32_logits_and_strided_rows(device):
    torch.manual_seed(5)
    wide = torch.randn(4, 200).to(device, torch.bfloat16)
    x = wide[:, :96]  # row stride 200
    w = torch.randn(33, 96).to(device, torch.bfloat16)
    got = skinny_linear(x, w, out_dtype=torch.float32, tiles=SkinnyTiles(block_t=16, block_n=16, block_k=32))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), skinny_linear_reference(x, w, torch.float32).cpu(), rtol=1e-2, atol=1e-2)


def test_skinny_linear_rejects_bad_input(device):
    x = torch.randn(2, 8, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight"):
        skinny_linear(x, torch.randn(4, 9, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="fp16 or bf16"):
        skinny_linear(x.float(), torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="share"):
        skinny_linear(x, torch.randn(4, 8, device=device, dtype=torch.float16))


def test_choose_tiles_fills_the_gpu():
    assert choose_skinny_tiles(1, 4096, 132).block_t == 1  # GEMV
    assert choose_skinny_tiles(16, 32000, 132).block_n == 64  # LM head: 500 programs
    assert choose_skinny_tiles(16, 4096, 132).block_n == 16  # o_proj: 256 programs, not 64
    assert choose_skinny_tiles(40, 4096, 132).block_t == 64
    for tokens in (1, 16, 33, 64):
        for n in (8, 4096, 6144, 32000, 151936):  # pipeline buffers fit the shared memory
            assert stage_bytes(choose_skinny_tiles(tokens, n, 132)) <= STAGE_BYTES_BUDGET


@pytest.mark.parametrize("t,n,k,tiles", [
    (1, 21, 96, SkinnyTiles(block_t=1, block_n=8, block_k=64)),  # masked K tail, ragged N
    (2, 40, 128, SkinnyTiles(block_t=2, block_n=16, block_k=64)),
    (5, 19, 64, SkinnyTiles(block_t=4, block_n=8, block_k=32)),  # two token tiles, one ragged
])
def test_gemv_tiles_match_reference(device, t, n, k, tiles):
    torch.manual_seed(n)
    x = torch.randn(t, k).to(device, torch.bfloat16)
    w = (torch.randn(n, k) / k**0.5).to(device, torch.bfloat16)
    got = skinny_linear(x, w, out_dtype=torch.float32, tiles=tiles)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.cpu(), skinny_linear_reference(x, w, torch.float32).cpu(), rtol=1e-3, atol=1e-3)
