"""Fused RMSNorm (+ residual add) and rotary kernels against their torch references."""

import pytest
import torch

from kernels.rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_reference
from kernels.rotary import apply_rotary, rotary_reference

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,h", [(1, 200), (5, 77)])
def test_rmsnorm_matches_reference(device, dtype, t, h):
    torch.manual_seed(0)
    x = (torch.randn(t, h) * 3).to(device, dtype)
    w = (torch.rand(h) + 0.5).to(device, dtype)
    got = rmsnorm(x, w, 1e-5)
    assert got.dtype == dtype and got.shape == (t, h)
    torch.testing.assert_close(got.float().cpu(), rmsnorm_reference(x, w, 1e-5).float().cpu(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm_returns_sum_and_norm(device, dtype):
    torch.manual_seed(1)
    t, h = 3, 130
    delta = torch.randn(t, 2 * h).to(device, dtype)[:, :h]  # strided rows
    res = torch.randn(t, h).to(device, dtype)
    w = torch.rand(h).to(device, dtype)
    s, y = add_rmsnorm(delta, res, w, 1e-6)
    want_s = res + delta
    if device == "cuda":
        assert torch.equal(s, want_s)  # rounded once to the dtype, as torch does
    else:  # Triton's interpreter truncates float32 -> bfloat16 (one ulp apart)
        torch.testing.assert_close(s.float(), want_s.float(), **TOL[dtype])
    torch.testing.assert_close(y.float().cpu(), rmsnorm_reference(want_s, w, 1e-6).float().cpu(), **TOL[dtype])


def test_add_rmsnorm_rounds_a_float32_delta_first(device):
    # The MoE kernel's float32 output goes into the norm unrounded: the kernel
    # must round it to the residual's dtype before the add, exactly as
    # delta.to(bf16) then the bf16 add would.
    torch.manual_seed(4)
    t, h = 3, 200
    d16 = torch.randn(t, h).to(device, torch.bfloat16)
    # ulp of d16: d = m * 2^e with m in [0.5, 1), 8 significant bits
    ulp = torch.ldexp(torch.ones_like(d16.float()), torch.frexp(d16.float()).exponent - 8)
    # 0.4 ulp away from zero: rounds (and truncates) back to d16, but added
    # unrounded it moves many sums across a rounding boundary.
    delta = d16.float() + 0.4 * ulp * d16.float().sign()
    res = torch.randn(t, h).to(device, torch.bfloat16)
    w = (torch.rand(h) + 0.5).to(device, torch.bfloat16)
    s, y = add_rmsnorm(delta, res, w, 1e-6)
    want_s, want_y = add_rmsnorm(d16, res, w, 1e-6)
    assert s.dtype == y.dtype == torch.bfloat16
    assert torch.equal(s, want_s) and torch.equal(y, want_y)
    unrounded = (res.float() + delta).to(torch.bfloat16)
    assert not torch.equal(unrounded, (res.float() + d16.float()).to(torch.bfloat16))  # the case can fail
    with pytest.raises(ValueError, match="float32"):
        add_rmsnorm(delta.half(), res, w, 1e-6)


def test_rmsnorm_rejects_bad_shapes(device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(x, torch.ones(7, device=device), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        add_rmsnorm(x, torch.randn(3, 8, device=device), torch.ones(8, device=device), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_reference(device, dtype):
    torch.manual_seed(2)
    t, hq, hk, d = 4, 5, 3, 12  # irregular: no power-of-two heads or half
    qkv = torch.randn(t, (hq + 2 * hk) * d).to(device, dtype)
    q = qkv[:, : hq * d].view(t, hq, d)  # views of a fused projection: row stride (hq + 2hk) d
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    positions = torch.tensor([0, 7, 4095, 123456], device=device)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)).to(device)
    qo, ko = apply_rotary(positions, inv_freq, q, k)
    rq, rk = rotary_reference(positions, inv_freq, q, k)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == dtype
    torch.testing.assert_close(qo.float().cpu(), rq.float().cpu(), **TOL[dtype])
    torch.testing.assert_close(ko.float().cpu(), rk.float().cpu(), **TOL[dtype])


def test_rotary_rejects_odd_head_dim(device):
    q = torch.randn(2, 3, 5, device=device)
    with pytest.raises(ValueError, match="head_dim"):
        apply_rotary(torch.zeros(2, dtype=torch.long, device=device), torch.ones(2, device=device), q, q)
