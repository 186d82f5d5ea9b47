"""RMSNorm, optionally fused with the residual add before it, in one launch.

Decode runs ~30 tiny elementwise launches per layer in plain torch (casts,
pow, mean, rsqrt, multiplies, adds); at B = 1 their fixed cost was ~3 ms of
an 11.6 ms step on the H200 (benchmarks/results/e2e_profile_h200.json). One
program per token row does the add, the statistics and the scale.

Numerics follow the order transformers uses (rmsnorm_reference, the CPU path of
dataplane/layers/norm.py): the
residual sum is rounded to the activation dtype, the statistics are float32,
the normalised row is rounded to the dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [T, H] the row to normalise (or the delta added to the residual)
    res_ptr,  # [T, H] residual stream in (HAS_RES)
    w_ptr,  # [H] weight
    y_ptr,  # [T, H] normalised out
    res_out_ptr,  # [T, H] x + residual out (HAS_RES)
    H, stride_x, stride_r, eps,
    HAS_RES: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    # The weight before the PDL wait (kernels/pdl.py): no launch writes it,
    # and it comes from HBM while x, just written, comes from the L2.
    w = tl.load(w_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    wait_for_previous_grid(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # A float32 delta (the MoE kernel's accumulator) is rounded to the
        # residual's dtype first, as a separate cast launch would (no-op else).
        x = x.to(res_out_ptr.dtype.element_ty)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * H + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / H + eps)
    normed = (x32 * inv).to(y_ptr.dtype.element_ty)
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(y_ptr + row * H + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, H] with unit last stride, got {tuple(x.shape)}")
    if weight.shape != (x.shape[1],) or weight.device != x.device:
        raise ValueError(f"weight must be [{x.shape[1]}] on {x.device}")


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """[T, H] weight * x / sqrt(mean(x^2) + eps), in x's dtype (pdl: kernels/pdl.py)."""
    _check(x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](x, x, weight, y, y, x.shape[1], x.stride(0), x.stride(0), eps,
                                       HAS_RES=False, BLOCK_H=triton.next_power_of_2(x.shape[1]),
                                       **pdl_options(x.device, x.shape[0], pdl))
    return y


def add_rmsnorm(delta: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float, pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rmsnorm(s)) with s = residual + delta, both [T, H] in residual's dtype.

    delta: residual's dtype or float32 (rounded to residual's dtype before the
    add, the same result as adding delta.to(residual.dtype)); pdl: kernels/pdl.py."""
    _check(delta, weight)
    if residual.shape != delta.shape or residual.stride(1) != 1 or residual.device != delta.device:
        raise ValueError("residual must match delta's [T, H] shape and device, unit last stride")
    if delta.dtype not in (residual.dtype, torch.float32):
        raise ValueError(f"delta must be {residual.dtype} (the residual's dtype) or float32, got {delta.dtype}")
    s = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    y = torch.empty_like(s)
    if delta.shape[0]:
        _rmsnorm_kernel[(delta.shape[0],)](delta, residual, weight, y, s, delta.shape[1], delta.stride(0),
                                           residual.stride(0), eps, HAS_RES=True,
                                           BLOCK_H=triton.next_power_of_2(delta.shape[1]),
                                           **pdl_options(delta.device, delta.shape[0], pdl))
    return s, y


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain torch in transformers' order (also the CPU path of the model)."""
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)  # [T, 1]
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)
