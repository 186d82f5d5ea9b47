"""y = x @ W^T for a decode batch of a few to 64 tokens on the tensor cores,
one launch taking part in programmatic dependent launch (kernels/pdl.py).

Why: past the one-token GEMV (kernels/dense_gemv.py) the attention
projections went to cuBLAS, which does not take part in PDL, so every
decode layer broke the PDL chain twice: the q/k/v product launched only
once the launch before it had completed, and the launch after it (rotary
and the KV store, then attention) likewise; the same around the o
projection. At B=1 the GEMV with PDL decoded 4.0 % faster than cuBLAS
(kernels/dense_gemv.py). Session 6 (benchmarks/NOTES.md) measured a
tensor-core tile without PDL level with cuBLAS at B=16 (q/k/v 18.8 against
19.2 us, o 14.6 against 16.0): what a launch of this size loses is its ramp,
which PDL overlaps with the launch before. Measured on the H100 (session 50,
benchmarks/results/*_h100_s50*.json): alone at 16 tokens q/k/v 20.2 us and
o 14.1 against cuBLAS's 20.7 and 15.5; end to end (synthetic Mixtral-8x7B,
4-bit, three interleaved rounds) B=4 453.4 -> 464.6 tok/s and B=16 1373.0
-> 1399.5: ~7 us a layer at B=16, of which the kernels' own time saves
~2 us; the rest is, by inference (not profiled), the launch gaps that the
unbroken PDL chain removes. At B=64 with no launch in PDL, 0.5 % slower
than cuBLAS; with the small launches in PDL (session 51) B=32 +1.4 % and
B=64 +0.4 % (kernels/pdl.py). At B=1, padded to 16 tokens, 3.3 % slower
than the one-token GEMV (247.2 against 255.7 tok/s)
(DataplaneConfig.dense_mma_max_tokens).

Shape: swap-AB. A program owns BN rows of W (the tensor cores' M side,
where the rows are many) and all BT tokens (N side, 16 at least, tokens
past T read clamped and never stored): acc [BN, BT] += W [BN, BK] @ x^T
[BK, BT] over the whole K in BK chunks, so W is read once and there is no
split-K reduce launch.

Contract: x [T, K] and W [N, K] of one dtype (fp16 or bf16), unit last
stride, 1 <= T <= MMA_MAX_TOKENS; out [T, N] in x's dtype (may be a
strided view), fp32 accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.dense_gemv import checked_operands, dense_gemv_reference
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid

# tl.dot needs 16 on a side: fewer tokens are padded to this tile.
MIN_TOKEN_TILE = 16
# The largest batch the kernel takes (token tile 64). Past it no launch of the
# step takes part in PDL (kernels.pdl.PDL_MAX_ROWS), and outside the chain it
# ran 0.5 % slower than cuBLAS end to end at B=64 (the module docstring).
MMA_MAX_TOKENS = 64
# Launch shape: session 6's fastest tensor-core tile on the H200 at Mixtral
# q/k/v and o (benchmarks/results/dense_tc_sweep_h200.json: 64 rows, K in
# chunks of 256, 5 stages; the most bytes in flight per multiprocessor).
BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 64, 256, 4, 5
# Past a 16-token tile, K in chunks of 128 at 5 stages (they fit the shared
# memory up to 64 tokens, where chunks of 256 fit 3-4). Measured, not
# explained (a guess: the same bytes in flight in finer steps leave less of
# the pipeline idle at its ends). H100, PDL on, q/k/v and o
# (benchmarks/results/dense_mma_t64_h100_s63.json): 32 tokens 19.3 / 13.5 us
# against 20.0 / 13.7, 64 tokens 20.0 / 14.1 against 20.7 / 15.9; 32-row tiles
# were no faster at either.
WIDE_BLOCK_K, WIDE_STAGES = 128, 5
# Shared memory a launch's pipeline stages may take: the H100 and H200 allow
# 227 KiB a program, and the default tile's 5 stages of W and x at 16 tokens
# take 200 KiB; a wider token tile gets fewer stages (pipeline_stages) instead
# of failing to launch (at 32 and 64 tokens it needed 240 and 320 KiB:
# benchmarks/results/dense_mma_h100_s50.json).
STAGE_SHARED_BUDGET = 216 * 1024


@dataclass(frozen=True)
class MmaTiles:
    """Rows per program (a power of two >= 16), K chunk (a power of two >=
    16), warps and pipeline stages of one launch."""

    block_n: int = BLOCK_N
    block_k: int = BLOCK_K
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES

    def __post_init__(self) -> None:
        for name, least in (("block_n", 16), ("block_k", 16), ("num_warps", 1)):
            v = getattr(self, name)
            if v < least or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {least}, got {v}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


def token_tile(tokens: int) -> int:
    """The kernel's token tile for a batch of `tokens` rows."""
    return max(MIN_TOKEN_TILE, triton.next_power_of_2(tokens))


def default_tiles(tokens: int) -> MmaTiles:
    """The launch shape for a batch of `tokens` rows when none is asked:
    MmaTiles() up to a 16-token tile, K chunks of WIDE_BLOCK_K past it."""
    if token_tile(tokens) <= MIN_TOKEN_TILE:
        return MmaTiles()
    return MmaTiles(block_k=WIDE_BLOCK_K, num_stages=WIDE_STAGES)


def pipeline_stages(tiles: MmaTiles, tokens: int, element_bytes: int) -> int:
    """tiles.num_stages, fewer where a stage's W and x^T tiles would take the
    pipeline past STAGE_SHARED_BUDGET at this batch's token tile."""
    stage_bytes = (tiles.block_n + token_tile(tokens)) * tiles.block_k * element_bytes
    return max(1, min(tiles.num_stages, STAGE_SHARED_BUDGET // stage_bytes))


@triton.jit(do_not_specialize=["T"])
def _mma_kernel(
    x_ptr,  # [T, K] fp16/bf16
    w_ptr,  # [N, K] fp16/bf16
    out_ptr,  # [T, N]
    T, N, K, stride_x, stride_w, stride_o,
    BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = tl.minimum(n, N - 1).to(tl.int64)  # rows past N read row N - 1, never stored
    t = tl.arange(0, BT)
    toks = tl.minimum(t, T - 1).to(tl.int64)  # likewise tokens past T
    kk = tl.arange(0, BK)
    w_ptrs = w_ptr + rows[:, None] * stride_w + kk[None, :]  # [BN, BK]
    x_ptrs = x_ptr + toks[None, :] * stride_x + kk[:, None]  # [BK, BT]: x^T
    # x is the previous launch's output (kernels/pdl.py's contract).
    wait_for_previous_grid(PDL)
    acc = tl.zeros((BN, BT), tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            inside = (k0 + kk) < K
            w = tl.load(w_ptrs, mask=inside[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=inside[:, None], other=0.0)
        acc = tl.dot(w, x, acc)  # [BN, BT]
        w_ptrs += BK
        x_ptrs += BK
    keep = (n < N)[:, None] & (t < T)[None, :]
    out_ptrs = out_ptr + t.to(tl.int64)[None, :] * stride_o + n[:, None]  # [BN, BT]: out^T
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=keep)


def dense_mma(x: torch.Tensor, weight: torch.Tensor, tiles: MmaTiles | None = None,
              out: torch.Tensor | None = None, pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """[T, N] = x [T, K] @ weight [N, K]^T for 1 <= T <= MMA_MAX_TOKENS, in
    one launch (the module docstring); tiles: its launch shape (None:
    default_tiles(T)); out: an optional [T, N] result buffer with a unit last
    stride; pdl: which launches take part in PDL."""
    out = checked_operands(x, weight, out, MMA_MAX_TOKENS, "dense_mma")
    tokens, k = x.shape
    n = weight.shape[0]
    tiles = tiles or default_tiles(tokens)
    grid = (triton.cdiv(n, tiles.block_n),)
    _mma_kernel[grid](
        x, weight, out, tokens, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BT=token_tile(tokens), BN=tiles.block_n, BK=tiles.block_k, EVEN_K=k % tiles.block_k == 0,
        num_warps=tiles.num_warps, num_stages=pipeline_stages(tiles, tokens, x.element_size()),
        **pdl_options(x.device, tokens, pdl),
    )
    return out


# The same product in fp32, rounded once to x's dtype (one reference for
# both dense decode kernels).
dense_mma_reference = dense_gemv_reference
