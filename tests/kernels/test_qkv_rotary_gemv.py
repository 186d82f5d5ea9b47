"""kernels/qkv_rotary_gemv.py against the launches it replaces (plain torch:
the q/k/v product, rotary and the KV store) at irregular shapes: K not a
multiple of the chunk, three pair counts per program, 1-4 tokens, a token
that is not stored; against the dense GEMV and rotary_cache_write
themselves; and its input checks."""

from __future__ import annotations

import pytest
import torch

from kernels.dense_gemv import GEMV_MAX_TOKENS, GemvTiles, dense_gemv
from kernels.qkv_rotary_gemv import QkvTiles, qkv_rotary_gemv, qkv_rotary_gemv_reference, qkv_rotary_gemv_suits
from kernels.rotary_cache_write import rotary_cache_write

# The product's rounding plus two ulps of the rotation (as test_rotary_cache_write).
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def _case(device, dtype, t, hq, hk, d, k, pages=5, layers=3, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(device, dtype)
    w = (torch.randn((hq + 2 * hk) * d, k, generator=g) / k**0.5).to(device, dtype)
    positions = torch.randint(0, 100000, (t,), generator=g).to(device)
    inv_freq = (1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))).to(device)
    cache = torch.randn(pages, layers, 2, bs, hk, d, generator=g).to(device, dtype)
    slots = torch.randperm(pages * bs, generator=g)[:t]
    slots[1::3] = -1  # the second token is not stored
    return x, w, positions, inv_freq, cache, slots.to(device)


def _written(cache: torch.Tensor, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """Where the stores of the tokens with a slot land: k and v of `layer`."""
    bs = cache.shape[3]
    mask = torch.zeros(cache.shape, dtype=torch.bool)
    for slot in slots.tolist():
        if slot >= 0:
            mask[slot // bs, layer, :, slot % bs] = True
    return mask.to(cache.device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,hq,hk,d,k,tiles", [
    (1, 6, 2, 16, 200, QkvTiles(block_k=64)),
    (3, 4, 1, 8, 96, QkvTiles(pairs=2, block_k=64)),
    (4, 2, 2, 16, 128, QkvTiles(pairs=8, block_k=128)),
])
def test_matches_the_launches_it_replaces(device, dtype, t, hq, hk, d, k, tiles):
    x, w, positions, inv_freq, cache, slots = _case(device, dtype, t, hq, hk, d, k, seed=t + k)
    layer = 1
    got_cache, want_cache = cache.clone(), cache.clone()
    q = qkv_rotary_gemv(x, w, positions, inv_freq, got_cache, layer, slots, hq, hk, tiles)
    want = qkv_rotary_gemv_reference(x, w, positions, inv_freq, want_cache, layer, slots, hq, hk)
    assert q.shape == (t, hq, d) and q.dtype == dtype and q.is_contiguous()
    assert rel_err(q, want) < REL_TOL[dtype]
    written = _written(cache, layer, slots)
    assert rel_err(got_cache[written], want_cache[written]) < REL_TOL[dtype]  # k rotated, v
    assert torch.equal(got_cache[~written], cache[~written])  # nothing else


def test_equals_gemv_then_rotary_cache_write(device):
    """The same products and rotation helpers as the two launches it replaces."""
    dtype, t, hq, hk, d, k = torch.bfloat16, 2, 4, 2, 16, 256
    x, w, positions, inv_freq, cache, slots = _case(device, dtype, t, hq, hk, d, k, seed=7)
    fused, split = cache.clone(), cache.clone()
    q = qkv_rotary_gemv(x, w, positions, inv_freq, fused, 0, slots, hq, hk, QkvTiles(block_k=128))
    qkv = dense_gemv(x, w, GemvTiles(block_k=128))
    q2 = rotary_cache_write(positions, inv_freq, qkv[:, : hq * d].view(t, hq, d),
                            qkv[:, hq * d : (hq + hk) * d].view(t, hk, d), qkv[:, (hq + hk) * d :].view(t, hk, d),
                            split, 0, slots)
    assert rel_err(q, q2) < 1e-2
    assert rel_err(fused, split) < 1e-2
    assert torch.equal(fused[~_written(cache, 0, slots)], split[~_written(cache, 0, slots)])


def test_suits_and_rejects_bad_input(device):
    assert qkv_rotary_gemv_suits(1, 128) and qkv_rotary_gemv_suits(GEMV_MAX_TOKENS, 128)
    assert not qkv_rotary_gemv_suits(GEMV_MAX_TOKENS + 1, 128)
    assert not qkv_rotary_gemv_suits(1, 12)  # half 6: not a multiple of 4 pairs
    x, w, positions, inv_freq, cache, slots = _case(device, torch.float16, 2, 4, 2, 16, 64)
    args = (positions, inv_freq, cache, 0, slots, 4, 2)
    with pytest.raises(ValueError, match="tokens"):
        qkv_rotary_gemv(torch.randn(GEMV_MAX_TOKENS + 1, 64, device=device, dtype=torch.float16), w, *args)
    with pytest.raises(ValueError, match="weight must be"):
        qkv_rotary_gemv(x, w[:-16], *args)
    with pytest.raises(ValueError, match="share fp16 or bf16"):
        qkv_rotary_gemv(x.float(), w, *args)
    with pytest.raises(ValueError, match="slot_mapping"):
        qkv_rotary_gemv(x, w, positions, inv_freq, cache, 0, slots.int(), 4, 2)
    with pytest.raises(ValueError, match="power of two"):
        QkvTiles(pairs=3)
    with pytest.raises(ValueError, match="power of two"):
        QkvTiles(block_k=100)
