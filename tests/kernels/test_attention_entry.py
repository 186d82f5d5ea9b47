"""kernels/attention_entry.py against the launches it replaces (plain torch:
add + RMSNorm, the q/k/v product, rotary and the KV store) at irregular
shapes: K not a multiple of the chunk, two pair counts per program, 1-4
tokens, a token that is not stored, with and without the norm and its
residual, a float32 delta; and its input checks."""

from __future__ import annotations

import pytest
import torch

from kernels.attention_entry import (EntryNorm, EntryTiles, attention_entry, attention_entry_reference,
                                     attention_entry_suits)
from kernels.dense_gemv import GEMV_MAX_TOKENS
from kernels.rotary_cache_write import rotary_cache_write

# bf16: the product's rounding plus two ulps of the rotation (as
# test_rotary_cache_write), and with the norm the normalised row is not
# rounded to bf16 before the product (the module docstring).
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
    return x, w, positions, inv_freq, cache, slots.to(device), g


def _compare(got, want, cache_got, cache_want, cache_before, layer, slots, dtype):
    (q, stream), (q_ref, stream_ref) = got, want
    assert q.shape == q_ref.shape and q.dtype == dtype and q.is_contiguous()
    assert rel_err(q, q_ref) < REL_TOL[dtype]
    bs = cache_before.shape[3]
    written = torch.zeros(cache_before.shape, dtype=torch.bool)
    for slot in slots.tolist():
        if slot >= 0:
            written[slot // bs, layer, :, slot % bs] = True
    written = written.to(cache_before.device)
    assert rel_err(cache_got[written], cache_want[written]) < REL_TOL[dtype]  # k rotated, v
    assert torch.equal(cache_got[~written], cache_before[~written])  # nothing else
    if stream_ref is None:
        assert stream is None
    else:
        # add_rmsnorm's rounding (the CPU interpreter's bf16 casts may round otherwise).
        assert stream.dtype == stream_ref.dtype and rel_err(stream, stream_ref) < REL_TOL[dtype] / 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,hq,hk,d,k,tiles", [
    (1, 6, 2, 16, 200, EntryTiles(block_k=64)),
    (3, 4, 1, 8, 96, EntryTiles(pairs=2, block_k=64)),
    (4, 2, 2, 16, 128, EntryTiles(pairs=8, block_k=128)),
])
@pytest.mark.parametrize("norm", ["none", "first", "residual", "residual_fp32"])
def test_matches_the_launches_it_replaces(device, dtype, t, hq, hk, d, k, tiles, norm):
    x, w, positions, inv_freq, cache, slots, g = _case(device, dtype, t, hq, hk, d, k, seed=t + k)
    entry_norm = None
    if norm != "none":
        weight = (1 + 0.3 * torch.randn(k, generator=g)).to(device, dtype)
        residual = None if norm == "first" else (torch.randn(t, k, generator=g) * 2).to(device, dtype)
        if norm == "residual_fp32":
            x = x.float() * 0.7
        entry_norm = EntryNorm(weight, 1e-5, residual)
    layer = 1
    got_cache, want_cache = cache.clone(), cache.clone()
    got = attention_entry(x, w, positions, inv_freq, got_cache, layer, slots, hq, hk, entry_norm, tiles)
    want = attention_entry_reference(x, w, positions, inv_freq, want_cache, layer, slots, hq, hk, entry_norm)
    _compare(got, want, got_cache, want_cache, cache, layer, slots, dtype)
    if norm == "first":
        assert got[1] is x


def test_without_the_norm_equals_gemv_then_rotary_cache_write(device):
    """One row tile's products in the same order, the same rotation helpers:
    bit for bit what the dense GEMV's output through rotary_cache_write gives."""
    from kernels.dense_gemv import GemvTiles, dense_gemv

    dtype, t, hq, hk, d, k = torch.bfloat16, 2, 4, 2, 16, 256
    x, w, positions, inv_freq, cache, slots, _ = _case(device, dtype, t, hq, hk, d, k, seed=7)
    fused, split = cache.clone(), cache.clone()
    q, _ = attention_entry(x, w, positions, inv_freq, fused, 0, slots, hq, hk, None, EntryTiles(block_k=128))
    qkv = dense_gemv(x, w, GemvTiles(block_k=128))
    q2 = rotary_cache_write(positions, inv_freq, qkv[:, : hq * d].view(t, hq, d),
                            qkv[:, hq * d : (hq + hk) * d].view(t, hk, d), qkv[:, (hq + hk) * d :].view(t, hk, d),
                            split, 0, slots)
    assert rel_err(q, q2) < 1e-2
    assert torch.equal(fused != cache, split != cache)  # the same slots written
    assert rel_err(fused, split) < 1e-2


def test_suits_and_rejects_bad_input(device):
    assert attention_entry_suits(1, 128) and attention_entry_suits(GEMV_MAX_TOKENS, 128)
    assert not attention_entry_suits(GEMV_MAX_TOKENS + 1, 128)
    assert not attention_entry_suits(1, 12)  # half 6: not a multiple of 4 pairs
    x, w, positions, inv_freq, cache, slots, _ = _case(device, torch.float16, 2, 4, 2, 16, 64)
    args = (positions, inv_freq, cache, 0, slots, 4, 2)
    with pytest.raises(ValueError, match="tokens"):
        attention_entry(torch.randn(GEMV_MAX_TOKENS + 1, 64, device=device, dtype=torch.float16), w, *args)
    with pytest.raises(ValueError, match="weight must be"):
        attention_entry(x, w[:-16], *args)
    with pytest.raises(ValueError, match="share the weight"):
        attention_entry(x.float(), w, *args)
    with pytest.raises(ValueError, match="norm's weight"):
        attention_entry(x, w, *args, EntryNorm(torch.ones(63, device=device, dtype=torch.float16), 1e-5))
    with pytest.raises(ValueError, match="residual must be"):
        attention_entry(x, w, *args, EntryNorm(torch.ones(64, device=device, dtype=torch.float16), 1e-5,
                                               torch.zeros(2, 64, device=device, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="slot_mapping"):
        attention_entry(x, w, positions, inv_freq, cache, 0, slots.int(), 4, 2)
    with pytest.raises(ValueError, match="power of two"):
        EntryTiles(pairs=3)
