"""y = x @ W^T for few tokens (decode): one pass over W, no split-K reduce.

At decode the dense projections are matrix-vector products: T (1..64) token
rows against a bf16 weight of millions of elements, so their time is W's bytes
over HBM bandwidth. cuBLAS picks split-K kernels for these shapes on the H200
and adds a reduce launch per GEMM (benchmarks/results/e2e_profile_h200.json:
the projections and LM head ran at about half the bytes roofline, 0.25 ms of
a 7 ms step in split-K reduces alone). Here each program owns BN output
features of BT tokens and streams its BN rows of W over the whole K in BK
chunks: W is read once, the accumulator stays in registers, one launch.

Contract: x [T, K] and W [N, K] in fp16 or bf16 (one dtype), unit last
stride; out [T, N] in out_dtype (x's dtype by default; float32 for logits),
fp32 accumulation. Rows of W past N and tokens past T are read clamped (no
masks in the loop) and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SKINNY_DTYPES = (torch.float16, torch.bfloat16)
DEFAULT_SMS = 132
# Launches should fill every multiprocessor at least this many times over,
# so that enough bytes are in flight per multiprocessor for HBM.
PROGRAMS_PER_SM = 2
# Shared memory one program may take for its pipeline stages (the H200 allows
# 227 KiB per block; the rest stays for the compiler's own buffers).
STAGE_BYTES_BUDGET = 192 * 1024
MAX_STAGES = 4
# tl.dot needs 16 rows a side; smaller token tiles take the GEMV kernel.
MMA_MIN_TOKENS = 16
GEMV_MAX_TOKENS = 4


@dataclass(frozen=True)
class SkinnyTiles:
    """Launch shape: BT tokens x BN features per program, K in BK chunks.
    block_t >= 16 multiplies on the tensor cores; below, the fp32 GEMV."""

    block_t: int = 16
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _skinny_linear_kernel(
    x_ptr,  # [T, K] fp16/bf16
    w_ptr,  # [N, K] fp16/bf16
    out_ptr,  # [T, N] out dtype
    T, N, K, stride_x, stride_w, stride_o,
    BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    kk = tl.arange(0, BK)
    rows = tl.minimum(n, N - 1).to(tl.int64)
    toks = tl.minimum(t, T - 1).to(tl.int64)
    w_ptrs = w_ptr + rows[:, None] * stride_w + kk[None, :]  # [BN, BK]
    x_ptrs = x_ptr + toks[None, :] * stride_x + kk[:, None]  # [BK, BT]
    acc = tl.zeros((BN, BT), tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            inside = (k0 + kk) < K
            w = tl.load(w_ptrs, mask=inside[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=inside[:, None], other=0.0)
        if UPCAST:
            acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)  # [BN, BT] += W[rows, k] @ x[toks, k]^T
        w_ptrs += BK
        x_ptrs += BK
    keep = (n < N)[:, None] & (t < T)[None, :]
    out_ptrs = out_ptr + t.to(tl.int64)[None, :] * stride_o + n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [T, K] fp16/bf16
    w_ptr,  # [N, K] fp16/bf16
    out_ptr,  # [T, N] out dtype
    T, N, K, stride_x, stride_w, stride_o,
    BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
):
    # No tensor cores: with one or two tokens the product's x tile would be a
    # 16-row broadcast that costs as much shared memory traffic as W itself.
    # Each thread multiplies its slice of W by x in fp32 and keeps the
    # products per (token, row, k lane); one reduction over k at the end.
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    rows = tl.minimum(n, N - 1).to(tl.int64)
    toks = tl.minimum(t, T - 1).to(tl.int64)
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
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
        w_ptrs += BK
        x_ptrs += BK
    y = tl.sum(acc, axis=2)  # [BT, BN]
    keep = (t < T)[:, None] & (n < N)[None, :]
    out_ptrs = out_ptr + t.to(tl.int64)[:, None] * stride_o + n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=keep)


def choose_skinny_tiles(tokens: int, n: int, num_sms: int = DEFAULT_SMS) -> SkinnyTiles:
    """Token tile just covering the batch (16..64); the widest feature tile
    that still gives PROGRAMS_PER_SM programs per multiprocessor."""
    if tokens <= GEMV_MAX_TOKENS:
        return SkinnyTiles(block_t=triton.next_power_of_2(tokens), block_n=8, block_k=512, num_stages=3)
    block_t = 16 if tokens <= 16 else (32 if tokens <= 32 else 64)
    t_tiles = triton.cdiv(tokens, block_t)
    block_n = 16
    for candidate in (64, 32):
        if triton.cdiv(n, candidate) * t_tiles >= PROGRAMS_PER_SM * num_sms:
            block_n = candidate
            break
    one_stage = stage_bytes(SkinnyTiles(block_t=block_t, block_n=block_n, num_stages=1))
    return SkinnyTiles(block_t=block_t, block_n=block_n,
                       num_stages=max(2, min(MAX_STAGES, STAGE_BYTES_BUDGET // one_stage)))


def stage_bytes(tiles: SkinnyTiles) -> int:
    """Shared memory of the launch's pipeline buffers (16-bit operands)."""
    return tiles.num_stages * (tiles.block_n + tiles.block_t) * tiles.block_k * 2


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
                  tiles: SkinnyTiles | None = None) -> torch.Tensor:
    """[T, N] = x [T, K] @ weight [N, K]^T, fp32 accumulation, one launch."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x [T, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype not in SKINNY_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"x and weight must share fp16 or bf16, got {x.dtype} and {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a unit last stride")
    if x.device != weight.device:
        raise ValueError("x and weight must be on one device")
    tokens, k = x.shape
    n = weight.shape[0]
    out = torch.empty(tokens, n, dtype=out_dtype or x.dtype, device=x.device)
    if tokens == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if tiles is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else DEFAULT_SMS
        tiles = choose_skinny_tiles(tokens, n, sms)
    grid = (triton.cdiv(n, tiles.block_n), triton.cdiv(tokens, tiles.block_t))
    if tiles.block_t < MMA_MIN_TOKENS:
        _gemv_kernel[grid](
            x, weight, out, tokens, n, k, x.stride(0), weight.stride(0), out.stride(0),
            BT=tiles.block_t, BN=tiles.block_n, BK=tiles.block_k, EVEN_K=k % tiles.block_k == 0,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
        return out
    _skinny_linear_kernel[grid](
        x, weight, out, tokens, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BT=tiles.block_t, BN=tiles.block_n, BK=tiles.block_k, EVEN_K=k % tiles.block_k == 0,
        # Triton's CPU interpreter multiplies bf16 tiles as raw integers (numpy
        # has no bf16): off the GPU the tiles go to fp32 before the product.
        UPCAST=not x.is_cuda,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return out


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The same product in fp32, rounded once to out_dtype."""
    return (x.float() @ weight.float().T).to(out_dtype or x.dtype)
