"""kernels/moe_offset_term.add_offset_term against a float64 reference: page
breaks inside the group range (per row), a partial last chunk, partial sums
per group, missing tokens, and sums whose low fp16 part matters."""

import pytest
import torch
import triton
import triton.language as tl

from kernels import weight_layout as wl
from kernels.moe_offset_term import add_offset_term

BN, BM = 16, 16


@triton.jit
def _offset_term_kernel(arena_ptr, sa_ptr, sb_ptr, sk_ptr, xs_ptr, n_tokens, g0, g1, xs_group_stride, xs_token_stride,
                        out_ptr, XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    n = tl.arange(0, BN)
    m = tl.arange(0, BM)
    sa = tl.load(sa_ptr + n)
    sb = tl.load(sb_ptr + n)
    sk = tl.load(sk_ptr + n)
    xs_ptrs = xs_ptr + m * xs_token_stride
    acc = add_offset_term(tl.zeros((BN, BM), tl.float32), arena_ptr, sa, sb, sk, g0, g1, xs_ptrs, m < n_tokens,
                          xs_group_stride, XS_SUB, BN, BM)
    tl.store(out_ptr + n[:, None] * BM + m[None, :], acc)


def _case(seed, n_groups, xs_sub, scale_of_sums):
    gen = torch.Generator().manual_seed(seed)
    words = 8192  # sb + 37 groups stay inside
    # Two places per row for its (scale, offset) words: before its page break
    # (groups < sk) and after it, TILE_ROWS words per group; distinct residues
    # mod TILE_ROWS, so that no two (row, group) words collide.
    residues = torch.randperm(2 * BN, generator=gen).to(torch.int32)
    sa = residues[:BN] + wl.TILE_ROWS * torch.randint(0, 8, (BN,), generator=gen, dtype=torch.int32)
    sb = residues[BN:] + wl.TILE_ROWS * torch.randint(64, 72, (BN,), generator=gen, dtype=torch.int32)
    sk = torch.randint(0, n_groups + 1, (BN,), generator=gen, dtype=torch.int32)
    arena = torch.randint(-2**31, 2**31 - 1, (words,), generator=gen, dtype=torch.int64).to(torch.int32)
    offsets = (torch.randn(BN, n_groups, generator=gen) * 0.1).to(torch.float16)
    scales = torch.randn(BN, n_groups, generator=gen).to(torch.float16)
    pair = (offsets.view(torch.int16).to(torch.int32) << 16) | (scales.view(torch.int16).to(torch.int32) & 0xFFFF)
    for n in range(BN):
        for g in range(n_groups):
            base = int(sa[n]) if g < int(sk[n]) else int(sb[n])
            arena[base + g * wl.TILE_ROWS] = pair[n, g]
    # fp32 partial sums that fp16 alone would round visibly (24 significant bits).
    xs = torch.randn(BM, n_groups, xs_sub, generator=gen, dtype=torch.float64) * scale_of_sums
    xs = (xs + torch.rand(BM, n_groups, xs_sub, generator=gen, dtype=torch.float64) * 1e-3).to(torch.float32)
    return arena, sa, sb, sk, offsets, xs


@pytest.mark.parametrize("n_groups,g0,g1,xs_sub,n_tokens,scale_of_sums",
                         [(37, 3, 37, 2, 11, 3e3), (16, 0, 16, 1, 16, 40.0), (9, 4, 5, 4, 1, 1e-2)])
def test_offset_term_matches_reference(device, n_groups, g0, g1, xs_sub, n_tokens, scale_of_sums):
    arena, sa, sb, sk, offsets, xs = _case(n_groups + xs_sub, n_groups, xs_sub, scale_of_sums)
    out = torch.full((BN, BM), float("nan"), device=device)
    xs_d = xs.reshape(BM, -1).contiguous().to(device)
    _offset_term_kernel[(1,)](arena.to(device), sa.to(device), sb.to(device), sk.to(device), xs_d, n_tokens,
                              g0, g1, xs_sub, xs_d.stride(0), out, XS_SUB=xs_sub, BN=BN, BM=BM)
    sums = xs.double().sum(-1)[:, g0:g1]  # [BM, groups]
    sums[n_tokens:] = 0
    ref = offsets[:, g0:g1].double() @ sums.T  # [BN, BM]
    got = out.cpu().double()
    assert bool(torch.isfinite(got).all())
    # add_offset_term's contract: each sum off by at most 2^-22 |s| + 2^-17
    # (hi + lo; fp16 alone would be 2^-11 |s|), plus fp32 accumulation.
    off = offsets[:, g0:g1].double().abs()
    bound = off @ (sums.abs() * 2.0**-21 + 2.0**-17).T
    assert bool(((got - ref).abs() <= bound).all()), float(((got - ref).abs() / bound).max())
    assert bool((got[:, n_tokens:] == 0).all())
