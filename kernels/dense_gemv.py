"""y = x @ W^T for one to four tokens (the decode step's attention
projections at B=1), one launch taking part in programmatic dependent launch.

Why: at B=1 the q/k/v and o products are matrix-vector products whose time
is W's bytes, yet cuBLAS took 27.8 us a Mixtral layer for 84 MB that need
19.6 us at the anchor bandwidth, plus a split-K reduce launch
(benchmarks/results/e2e_h200_s19_b1_profile.json). This is session 6's GEMV
(benchmarks/NOTES.md: fp32 products per (token, row, k lane), one reduction
at the end; no tensor cores, whose 16-row x tile would cost as much shared
memory as W) with the PDL wait of kernels/pdl.py, so that its programs
become resident under the previous launch. End to end it decodes the
synthetic Mixtral-8x7B 4-bit at B=1 4.0 % faster than cuBLAS, at B=2 1.2 %
and at B=4 6.9 % slower (benchmarks/results/e2e_h200_s20_{cublas,gemv_nopf,
b2_*}.json), hence DataplaneConfig.dense_gemv_max_tokens. An L2 prefetch of
W's first columns before the wait gained nothing (e2e_h200_s20_gemv.json);
removed. Asking the L2 for the o weight from the q/k/v launch's programs
after their loads (cp.async.bulk.prefetch.L2, for the o launch after the
latency-bound rotary, attention and merge) made B=1 5.5 % slower at 4 bits
(e2e_h200_s26_warm_*.json); removed.

Contract: x [T, K] and W [N, K] of one dtype (fp16 or bf16), unit last
stride, 1 <= T <= GEMV_MAX_TOKENS; out [T, N] in x's dtype, fp32
accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

GEMV_DTYPES = (torch.float16, torch.bfloat16)
GEMV_MAX_TOKENS = 4
# Launch shape: the best GEMV of session 6's sweep at Mixtral q/k/v, B=1
# (benchmarks/results/dense_gemv_sweep_h200.json: 18.4 us against cuBLAS's
# 19.1 with W rotated past the L2).
BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 8, 512, 4, 3


@dataclass(frozen=True)
class GemvTiles:
    """Rows per program (a power of two), K chunk (a power of two), warps
    and pipeline stages of one launch."""

    block_n: int = BLOCK_N
    block_k: int = BLOCK_K
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


@triton.jit
def gemv_rows(x_ptr, w_ptr, rows, toks, K, stride_x, stride_w,
              BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """[BT, BN] fp32 products of tokens toks [BT] (int64) of x with rows
    [BN] (int64) of W: fp32 per (token, row, k lane), one reduction at the
    end (kernels/qkv_rotary_gemv.py takes it too)."""
    kk = tl.arange(0, BK)
    w_ptrs = w_ptr + rows[:, None] * stride_w + kk[None, :]  # [BN, BK]
    x_ptrs = x_ptr + toks[:, None] * stride_x + kk[None, :]  # [BT, BK]
    acc = tl.zeros((BT, BN, BK), tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            inside = (k0 + kk) < K
            w = tl.load(w_ptrs, mask=inside[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=inside[None, :], other=0.0)
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]  # [BT, BN, BK]
        w_ptrs += BK
        x_ptrs += BK
    return tl.sum(acc, axis=2)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [T, K] fp16/bf16
    w_ptr,  # [N, K] fp16/bf16
    out_ptr,  # [T, N]
    T, N, K, stride_x, stride_w, stride_o,
    BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = tl.minimum(n, N - 1).to(tl.int64)
    wait_for_previous_grid(PDL)
    t = tl.arange(0, BT)
    toks = tl.minimum(t, T - 1).to(tl.int64)
    y = gemv_rows(x_ptr, w_ptr, rows, toks, K, stride_x, stride_w, BT, BN, BK, EVEN_K)  # [BT, BN]
    keep = (t < T)[:, None] & (n < N)[None, :]
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_o + n[None, :], y.to(out_ptr.dtype.element_ty), mask=keep)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, tiles: GemvTiles | None = None,
               out: torch.Tensor | None = None, pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """[T, N] = x [T, K] @ weight [N, K]^T for 1 <= T <= GEMV_MAX_TOKENS, in
    one launch (the module docstring); out: an optional [T, N] result buffer;
    pdl: which launches take part in PDL (kernels/pdl.py)."""
    out = checked_operands(x, weight, out, GEMV_MAX_TOKENS, "dense_gemv")
    tokens, k = x.shape
    n = weight.shape[0]
    tiles = tiles or GemvTiles()
    grid = (triton.cdiv(n, tiles.block_n),)
    _gemv_kernel[grid](
        x, weight, out, tokens, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BT=triton.next_power_of_2(tokens), BN=tiles.block_n, BK=tiles.block_k, EVEN_K=k % tiles.block_k == 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        **pdl_options(x.device, tokens, pdl),
    )
    return out


def checked_operands(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None, max_tokens: int,
                     kernel: str) -> torch.Tensor:
    """The checks of a dense decode product's operands (this GEMV's and
    kernels/dense_mma.py's): x [T, K] and weight [N, K] of one fp16/bf16
    dtype with unit last strides on one device, 1 <= T <= max_tokens; returns
    out, allocated [T, N] when None, else checked to be that shape with a
    unit last stride."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x [T, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype not in GEMV_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"x and weight must share fp16 or bf16, got {x.dtype} and {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a unit last stride")
    if x.device != weight.device:
        raise ValueError("x and weight must be on one device")
    tokens, k = x.shape
    n = weight.shape[0]
    if not 1 <= tokens <= max_tokens or k == 0 or n == 0:
        raise ValueError(f"{kernel} takes 1..{max_tokens} tokens and K, N > 0; got {tokens} x {k} -> {n}")
    if out is None:
        return torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    if out.shape != (tokens, n) or out.dtype != x.dtype or out.stride(1) != 1 or out.device != x.device:
        raise ValueError(f"out must be [{tokens}, {n}] {x.dtype} on {x.device} with a unit last stride")
    return out


def dense_gemv_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same product in fp32, rounded once to x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
