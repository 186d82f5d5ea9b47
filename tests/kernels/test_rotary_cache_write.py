"""The decode step's fused rotary + KV store against rotary_reference and the
plain-torch stores (kernels/rotary_cache_write.py)."""

import pytest
import torch

from kernels.paged_attention import write_kv_cache
from kernels.rotary import apply_rotary
from kernels.rotary_cache_write import HEADS_PER_PROGRAM, rotary_cache_write, rotary_cache_write_reference

# bf16: two ulps of |x| < 4 (cos and sin rounded to bf16 may differ from
# torch's in the last ulp, and the products are rounded again).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=3.2e-2)}


def _case(device, dtype, t, hq, hk, d, pages=5, layers=3, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hk) * d + 3, generator=g).to(device, dtype)  # padded rows: strided views
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    v = qkv[:, (hq + hk) * d : (hq + 2 * hk) * d].view(t, hk, d)
    positions = torch.randint(0, 100000, (t,), generator=g).to(device)
    inv_freq = (1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))).to(device)
    cache = torch.randn(pages, layers, 2, bs, hk, d, generator=g).to(device, dtype)
    slots = torch.randperm(pages * bs, generator=g)[:t]
    slots[::3] = -1  # every third token is not stored
    return positions, inv_freq, q, k, v, cache, slots.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,hq,hk,d", [(5, 5, 3, 12), (4, 2 * HEADS_PER_PROGRAM + 3, HEADS_PER_PROGRAM + 3, 16),
                                       (1, 8, 2, 32)])
def test_rotary_cache_write_matches_reference(device, dtype, t, hq, hk, d):
    positions, inv_freq, q, k, v, cache, slots = _case(device, dtype, t, hq, hk, d)
    layer = 1
    got_cache, want_cache = cache.clone(), cache.clone()
    qo = rotary_cache_write(positions, inv_freq, q, k, v, got_cache, layer, slots)
    want_q = rotary_cache_write_reference(positions, inv_freq, q, k, v, want_cache, layer, slots)
    assert qo.shape == q.shape and qo.dtype == dtype and qo.is_contiguous()
    torch.testing.assert_close(qo.float().cpu(), want_q.float().cpu(), **TOL[dtype])
    # The whole cache: rotated keys and copied values where stored, the rest untouched.
    torch.testing.assert_close(got_cache[:, :, 0].float().cpu(), want_cache[:, :, 0].float().cpu(), **TOL[dtype])
    assert torch.equal(got_cache[:, :, 1], want_cache[:, :, 1])
    other = [i for i in range(cache.shape[1]) if i != layer]
    assert torch.equal(got_cache[:, other], cache[:, other])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cache_write_equals_the_two_launches_it_replaces(device, dtype):
    """Same helpers, same rounding: bit for bit what apply_rotary + write_kv_cache store."""
    positions, inv_freq, q, k, v, cache, slots = _case(device, dtype, 6, 2 * HEADS_PER_PROGRAM + 1, 3, 8, seed=4)
    fused, split = cache.clone(), cache.clone()
    qo = rotary_cache_write(positions, inv_freq, q, k, v, fused, 2, slots)
    q2, k2 = apply_rotary(positions, inv_freq, q, k)
    write_kv_cache(k2, v.contiguous(), split, 2, slots)
    assert torch.equal(qo, q2)
    assert torch.equal(fused, split)


def test_rotary_cache_write_rejects_bad_input(device):
    positions, inv_freq, q, k, v, cache, slots = _case(device, torch.float32, 3, 4, 2, 8)
    with pytest.raises(ValueError, match="layer"):
        rotary_cache_write(positions, inv_freq, q, k, v, cache, cache.shape[1], slots)
    with pytest.raises(ValueError, match="kv_cache"):
        rotary_cache_write(positions, inv_freq, q, k, v, cache[:, :, :, :, :1], 0, slots)
    with pytest.raises(ValueError, match="int64"):
        rotary_cache_write(positions, inv_freq, q, k, v, cache, 0, slots.int())
    with pytest.raises(ValueError, match="dtype"):
        rotary_cache_write(positions, inv_freq, q, k, v.double(), cache, 0, slots)
    with pytest.raises(ValueError, match="k and v"):
        rotary_cache_write(positions, inv_freq, q, k, v[:, :1], cache, 0, slots)
