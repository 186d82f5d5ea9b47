"""Greedy decoding's pick: the index of each row's largest logit, in one launch.

The decode step used to cast the LM head's bf16 logits to float32 (4.0 us at
B=1 on the H200) and take torch's argmax (10.0 us, benchmarks/NOTES.md
session 30) after every replay. The cast is exact, so the argmax of the bf16
row is the same token; this kernel reads the logits in their own dtype, one
program a row, inside the decode graph.

Contract (as torch.argmax): the first index of the maximum, so ties go to the
lowest index. NaN is never picked (torch's argmax would pick the first NaN; a
NaN logit is a fault upstream, and this keeps the pick in range): a row of
NaN and -inf only gives its first index, as an all -inf row does.

End to end on the H200 (synthetic Mixtral-8x7B, 4-bit, three interleaved
rounds, together with RoutingStats' one buffer; benchmarks/results/
e2e_h200_s31_ab.json, v1 -> v2): B=1 310.9-312.3 -> 312.4-313.6 tok/s,
B=16 level.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# One chunk holds a whole Mixtral / Llama row (vocab 32000) so that its loads
# go out in one round; longer rows loop over chunks of this size.
MAX_BLOCK_V = 32768
# Values per thread of a chunk: a full chunk is 32 warps, four 16-byte loads
# a thread at bf16.
VALUES_PER_THREAD = 32
MAX_WARPS = 32
THREADS_PER_WARP = 32


@triton.jit
def _row_argmax_kernel(
    x_ptr,  # [B, V] logits, unit last stride
    out_ptr,  # [B] int64 picks
    V, stride_x,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK_V)  # [BLOCK_V]
    # Each lane keeps the best value it has seen and its index; lanes past V
    # hold -inf with an index >= V, which loses to any lane inside the row.
    x = tl.load(base + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
    best = tl.where(x == x, x, -float("inf"))  # NaN never wins
    best_idx = offs
    for start in range(BLOCK_V, V, BLOCK_V):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < V, other=-float("inf")).to(tl.float32)
        better = x > best  # strict: an equal value later in the row keeps the earlier index (and NaN > y is false)
        best = tl.where(better, x, best)
        best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_idx, V), axis=0)
    tl.store(out_ptr + row, first.to(tl.int64))


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """[B, V] float logits (unit last stride, V >= 1) -> [B] int64: each row's
    first index of its maximum (module docstring: ties, NaN)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [B, V] with unit last stride, got shape {tuple(x.shape)} strides {x.stride()}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")
    rows, vocab = x.shape
    if vocab < 1:
        raise ValueError("x must have at least one column")
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        block = min(triton.next_power_of_2(vocab), MAX_BLOCK_V)
        warps = max(1, min(MAX_WARPS, block // (THREADS_PER_WARP * VALUES_PER_THREAD)))
        _row_argmax_kernel[(rows,)](x, out, vocab, x.stride(0), BLOCK_V=block, num_warps=warps)
    return out


def row_argmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Plain torch with the same contract: NaN treated as -inf, then torch's argmax."""
    return x.masked_fill(torch.isnan(x), -float("inf")).argmax(dim=-1)
