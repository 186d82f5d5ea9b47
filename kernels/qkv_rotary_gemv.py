"""The fused q/k/v GEMV of one to four tokens with rotary and the KV store in
its epilogue, one launch taking part in PDL.

Why: at B=1 a Mixtral layer's q/k/v product (kernels/dense_gemv.py) is
followed by rotary_cache_write (kernels/rotary_cache_write.py), a launch that
is almost all latency: 2.0 us of the step's critical path a layer on the H200
under PDL (benchmarks/results/e2e_h200_s27_b1_profile_pdl16.json, the
benchmarks/decode_profile.py share). Here the GEMV's programs rotate and
store their own results, one launch fewer a layer.

Measured, not adopted (DataplaneConfig.fuse_qkv_rotary is off): end to end
(synthetic Mixtral-8x7B, 4-bit experts, B=1) it gains nothing. In one call
with every variant interleaved (benchmarks/results/e2e_h200_s27_c4_*.json):
off 299.0 / 298.7 tok/s, this kernel 296.5 / 298.3, its first form (e6f0797,
the same kernel inside kernels/attention_entry.py) 297.6 / 297.7. An earlier
call gave 302.4 against 297.0 / 297.6 (e2e_h200_s27_entry_*.json, one run
of the fused form) and the next one 296.9 / 296.7 against 299.1
(e2e_h200_s27_rot_*.json). The removed launch's critical-path share was not
saved: under PDL the next launch (decode attention) became resident and
ramped up while rotary ran, and now does so after the GEMV's epilogue.

* rows: program p takes PAIRS rotary pairs of one head, the 2 * PAIRS rows
  (i, i + HALF) of W, interleaved, so rotating its results needs no other
  program (rotate-half pairs a head's row i with row i + HALF). Heads are
  W's q heads, then k heads, then v heads (MixtralAttention.fuse_qkv); v
  rows are not rotated. Each row's product is the dense GEMV's (fp32 per
  (token, row, k lane), one reduction at the end).
* the epilogue rounds the product to the activation dtype (the GEMV's
  output), rotates q and k rows with kernels/rotary.py's angles and
  rounding, and stores q to a contiguous [T, q_heads, D] and k, v at the
  token's KV slot (slot < 0: not stored), as rotary_cache_write does.

Tried and removed: the input norm and its residual add in the same launch
(each program formed residual + delta chunk by chunk, multiplied by the norm
weight, and scaled by 1 / rms at the end; program 0 stored the sum). Every
program then reads the delta, the residual and the norm weight besides W,
and B=1 fell to 284.7 / 284.5 tok/s at 4 bits, 211.6 / 211.9 at 8, against
297.0 / 297.6 and 218.6 / 219.0 (e2e_h200_s27_entry_*.json). That run's
profile gave the launch 22.8 us a layer against 11.0 for the o GEMV (2/3 of
its weight bytes), but inflated every share (gate/up 66.5 against 41.8 us in
e2e_h200_s27_b1_profile_pdl16.json), so only the ratio says much.

Contract: weight [(q_heads + 2 kv_heads) * D, K] contiguous, D = 2 * HALF
with HALF a multiple of tiles.pairs; x [T, K] of the weight's dtype, unit
last stride, 1 <= T <= GEMV_MAX_TOKENS. Nothing is read before the PDL wait
(kernels/pdl.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.dense_gemv import (BLOCK_K, GEMV_DTYPES, GEMV_MAX_TOKENS, NUM_STAGES, NUM_WARPS, GemvTiles,
                                dense_gemv_reference, gemv_rows)
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.rotary_cache_write import check_rotary_cache_inputs, rotary_cache_write_reference

# Rotary pairs per program: 8 rows, the dense GEMV's best launch shape
# (kernels/dense_gemv.py BLOCK_N).
PAIRS = 4


@dataclass(frozen=True)
class QkvTiles:
    """Rotary pairs per program (2 x as many W rows) and the GEMV's K chunk,
    warps and stages (kernels/dense_gemv.GemvTiles, validated there)."""

    pairs: int = PAIRS
    block_k: int = BLOCK_K
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES

    def __post_init__(self) -> None:
        if self.pairs < 1 or self.pairs & (self.pairs - 1):
            raise ValueError(f"pairs must be a power of two, got {self.pairs}")
        GemvTiles(2 * self.pairs, self.block_k, self.num_warps, self.num_stages)


@triton.jit
def _qkv_rotary_gemv_kernel(
    x_ptr,  # [T, K] the normalised rows
    w_ptr,  # [(q_heads + 2 kv_heads) * 2 HALF, K] q, k, v rows
    pos_ptr,  # [T] int64 positions
    inv_freq_ptr,  # [HALF] float32
    qo_ptr,  # [T, q_heads, 2 HALF] contiguous out: rotated q
    kv_ptr,  # [pages, layers, 2, BS, kv_heads, 2 HALF] the arena's KV view (page stride page_stride)
    slot_ptr,  # [T] int64 slot = page * BS + offset, < 0 = skip
    T, K, stride_x, stride_w, q_heads, kv_heads, layer, page_stride,
    BT: tl.constexpr, PAIRS: tl.constexpr, BK: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    head = pid // (HALF // PAIRS)
    pair0 = (pid % (HALF // PAIRS)) * PAIRS
    r = tl.arange(0, 2 * PAIRS)
    in_head = (r % 2) * HALF + pair0 + r // 2  # [2 PAIRS]: rows i, i + HALF interleaved
    rows = (head * 2 * HALF + in_head).to(tl.int64)
    wait_for_previous_grid(PDL)
    dt = qo_ptr.dtype.element_ty
    t = tl.arange(0, BT)
    toks = tl.minimum(t, T - 1).to(tl.int64)
    # [BT, 2 PAIRS], rounded as the projection's output
    y = gemv_rows(x_ptr, w_ptr, rows, toks, K, stride_x, stride_w, BT, 2 * PAIRS, BK, EVEN_K).to(dt)
    # Rotation with kernels/rotary.py's angles and rounding (q and k heads).
    x1, x2 = tl.split(tl.reshape(y, (BT, PAIRS, 2)))  # [BT, PAIRS]: rows i and i + HALF
    pos = tl.load(pos_ptr + toks).to(tl.float32)  # [BT]
    freq = tl.load(inv_freq_ptr + pair0 + tl.arange(0, PAIRS))  # [PAIRS]
    angle = pos[:, None] * freq[None, :]  # [BT, PAIRS]
    c = tl.cos(angle).to(dt).to(tl.float32)
    sn = tl.sin(angle).to(dt).to(tl.float32)
    a1 = (x1.to(tl.float32) * c).to(dt).to(tl.float32)
    b1 = -(x2.to(tl.float32) * sn).to(dt).to(tl.float32)
    a2 = (x2.to(tl.float32) * c).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * sn).to(dt).to(tl.float32)
    rotated = tl.reshape(tl.join((a1 + b1).to(dt), (a2 + b2).to(dt)), (BT, 2 * PAIRS))
    live = (t < T)[:, None]  # [BT, 1]
    if head < q_heads:
        tl.store(qo_ptr + t.to(tl.int64)[:, None] * (q_heads * 2 * HALF) + rows[None, :], rotated, mask=live)
    else:
        slot = tl.load(slot_ptr + toks)  # [BT]
        token_elems = kv_heads * 2 * HALF  # elements of one token's k (or v) in a page
        k_row = (kv_ptr + (slot // BS) * page_stride + layer * (2 * BS * token_elems)
                 + (slot % BS) * token_elems)  # [BT]
        stored = live & (slot >= 0)[:, None]
        kv_rows = rows - q_heads * 2 * HALF  # [2 PAIRS] within k's rows, or token_elems + v's
        if head < q_heads + kv_heads:
            tl.store(k_row[:, None] + kv_rows[None, :], rotated, mask=stored)
        else:
            tl.store(k_row[:, None] + (BS - 1) * token_elems + kv_rows[None, :], y, mask=stored)


def qkv_rotary_gemv_suits(tokens: int, head_dim: int, tiles: QkvTiles | None = None) -> bool:
    """Whether qkv_rotary_gemv applies: 1..GEMV_MAX_TOKENS rows and heads
    whose rotary half is a multiple of the pairs per program."""
    tiles = tiles or QkvTiles()
    return 1 <= tokens <= GEMV_MAX_TOKENS and head_dim % 2 == 0 and (head_dim // 2) % tiles.pairs == 0


def qkv_rotary_gemv(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                    kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor, num_heads: int,
                    num_kv_heads: int, tiles: QkvTiles | None = None,
                    pdl: PdlPolicy = DEFAULT_PDL) -> torch.Tensor:
    """Rotated q [T, num_heads, D] (new, contiguous) of x @ weight^T; the
    rotated k and v stored at each token's slot of `layer` in kv_cache.

    x: [T, K] of the weight's dtype; weight: [(num_heads + 2 num_kv_heads) *
    D, K] contiguous, q rows, then k, then v; positions, inv_freq, kv_cache,
    slot_mapping as kernels/rotary_cache_write.rotary_cache_write takes them;
    pdl: kernels/pdl.py.
    """
    tiles = tiles or QkvTiles()
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, K] with unit last stride, got {tuple(x.shape)}")
    tokens, k = x.shape
    d = kv_cache.shape[-1] if kv_cache.dim() == 6 else 0
    if not qkv_rotary_gemv_suits(tokens, d, tiles):
        raise ValueError(f"qkv_rotary_gemv takes 1..{GEMV_MAX_TOKENS} tokens and head_dim / 2 a multiple of "
                         f"{tiles.pairs}; got {tokens} tokens, head_dim {d}")
    if weight.shape != ((num_heads + 2 * num_kv_heads) * d, k) or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{(num_heads + 2 * num_kv_heads) * d}, {k}], "
                         f"got {tuple(weight.shape)}")
    if weight.dtype not in GEMV_DTYPES or x.dtype != weight.dtype or weight.device != x.device:
        raise ValueError(f"x and weight must share fp16 or bf16 and a device, got {x.dtype} and {weight.dtype}")
    qo = torch.empty(tokens, num_heads, d, dtype=x.dtype, device=x.device)
    # rotary_cache_write's checks of the cache, positions and slots, on a view of qo's geometry.
    kv_view = qo[:, :num_kv_heads]  # [T, kv_heads, D]
    check_rotary_cache_inputs(positions, inv_freq, qo, kv_view, kv_view, kv_cache, layer, slot_mapping)
    programs = (num_heads + 2 * num_kv_heads) * (d // 2) // tiles.pairs
    _qkv_rotary_gemv_kernel[(programs,)](
        x, weight, positions, inv_freq.float(), qo, kv_cache, slot_mapping,
        tokens, k, x.stride(0), weight.stride(0), num_heads, num_kv_heads, layer, kv_cache.stride(0),
        BT=triton.next_power_of_2(tokens), PAIRS=tiles.pairs, BK=tiles.block_k, HALF=d // 2,
        BS=kv_cache.shape[3], EVEN_K=k % tiles.block_k == 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        **pdl_options(x.device, tokens, pdl),
    )
    return qo


def qkv_rotary_gemv_reference(x, weight, positions, inv_freq, kv_cache, layer, slot_mapping, num_heads,
                              num_kv_heads) -> torch.Tensor:
    """The launches it replaces, in plain torch: the projection rounded once
    (dense_gemv_reference), then rotary_cache_write_reference."""
    d = kv_cache.shape[-1]
    qkv = dense_gemv_reference(x, weight)  # [T, (hq + 2 hk) * D]
    q = qkv[:, : num_heads * d].view(-1, num_heads, d)
    k = qkv[:, num_heads * d : (num_heads + num_kv_heads) * d].view(-1, num_kv_heads, d)
    v = qkv[:, (num_heads + num_kv_heads) * d :].view(-1, num_kv_heads, d)
    return rotary_cache_write_reference(positions, inv_freq, q, k, v, kv_cache, layer, slot_mapping)
