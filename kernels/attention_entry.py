"""The attention's entry at one to four tokens in one launch: (the residual add
+ RMSNorm), the fused q/k/v GEMV, rotary, and the KV store.

Why: at B=1 a Mixtral layer entered attention with three launches, add_rmsnorm
(kernels/rmsnorm.py), the q/k/v GEMV (kernels/dense_gemv.py) and
rotary_cache_write (kernels/rotary_cache_write.py), whose shares of the
step's critical path were 2.1 + ~15 + 2.0 us a layer on the H200 under PDL
(benchmarks/results/e2e_h200_s27_b1_profile_pdl16.json): the two small ones
are almost all latency. Here they are one GEMV whose programs also do the
work before and after it:

* rows: program p takes PAIRS rotary pairs of one head, the 2 * PAIRS rows
  (i, i + HALF) of W, interleaved, so the rotation of its results needs no
  other program (rotate-half pairs a head's row i with row i + HALF). Heads
  are W's q heads, then k heads, then v heads (MixtralAttention.fuse_qkv);
  v rows are not rotated.
* NORM: the input is the row before the norm. The program forms
  s = residual + delta chunk by chunk as add_rmsnorm does (program 0 stores
  s, the new residual stream), multiplies it by the norm weight, and sums
  s^2 on the way; the product is scaled by 1 / rms(s) at the end. So the
  normalised row is never rounded to the activation dtype: the result
  differs from add_rmsnorm -> GEMV in the last bits (within bf16's rounding).
  Without NORM the input is the normalised row itself.
* the epilogue rounds the product to the activation dtype (as the GEMV's
  output), rotates q and k rows with kernels/rotary.py's rounding, and stores
  q to a contiguous [T, q_heads, D] and k, v at the token's KV slot
  (slot < 0: not stored), as rotary_cache_write does.

Contract: weight [(q_heads + 2 kv_heads) * D, K] contiguous, D = 2 * HALF
with HALF a multiple of tiles.pairs; x (or delta, residual) [T, K], unit last
stride, 1 <= T <= GEMV_MAX_TOKENS. A kernel taking part in PDL
(kernels/pdl.py): nothing is read before its wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.dense_gemv import BLOCK_K, GEMV_DTYPES, GEMV_MAX_TOKENS, NUM_STAGES, NUM_WARPS, dense_gemv_reference
from kernels.pdl import DEFAULT_PDL, PdlPolicy, pdl_options, wait_for_previous_grid
from kernels.rmsnorm import rmsnorm_reference
from kernels.rotary_cache_write import _check as check_rotary_inputs
from kernels.rotary_cache_write import rotary_cache_write_reference

# Rotary pairs per program: 8 rows, the dense GEMV's best launch shape
# (kernels/dense_gemv.py BLOCK_N).
PAIRS = 4


@dataclass(frozen=True)
class EntryTiles:
    """Rotary pairs per program (2 x as many W rows), K chunk, warps and
    pipeline stages of one launch; pairs and block_k powers of two."""

    pairs: int = PAIRS
    block_k: int = BLOCK_K
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES

    def __post_init__(self) -> None:
        for name in ("pairs", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


@dataclass(frozen=True)
class EntryNorm:
    """The norm before the projection: its weight [K] and eps, and the
    residual stream [T, K] that the input (then a delta) is added to first;
    residual None: the input is normalised as it is (the first layer)."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None


@triton.jit
def _attention_entry_kernel(
    x_ptr,  # [T, K] the normalised row, or (NORM) the delta / the row to normalise
    res_ptr,  # [T, K] residual stream in (NORM and HAS_RES)
    norm_w_ptr,  # [K] RMSNorm weight (NORM)
    res_out_ptr,  # [T, K] residual + delta out (NORM and HAS_RES), x's activation dtype
    w_ptr,  # [(q_heads + 2 kv_heads) * 2 HALF, K] q, k, v rows
    pos_ptr,  # [T] int64 positions
    inv_freq_ptr,  # [HALF] float32
    qo_ptr,  # [T, q_heads, 2 HALF] contiguous out: rotated q
    kv_ptr,  # [pages, layers, 2, BS, kv_heads, 2 HALF] the arena's KV view (page stride page_stride)
    slot_ptr,  # [T] int64 slot = page * BS + offset, < 0 = skip
    T, K, stride_x, stride_r, stride_w, eps, q_heads, kv_heads, layer, page_stride,
    BT: tl.constexpr, PAIRS: tl.constexpr, BK: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
    EVEN_K: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
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
    kk = tl.arange(0, BK)
    w_ptrs = w_ptr + rows[:, None] * stride_w + kk[None, :]  # [2 PAIRS, BK]
    x_ptrs = x_ptr + toks[:, None] * stride_x + kk[None, :]  # [BT, BK]
    r_ptrs = res_ptr + toks[:, None] * stride_r + kk[None, :]
    acc = tl.zeros((BT, 2 * PAIRS, BK), tl.float32)
    sumsq = tl.zeros((BT, BK), tl.float32)
    keep_s = ((t < T) & (t * 0 + pid == 0))[:, None]  # [BT, 1]: program 0 stores the residual stream
    for k0 in range(0, K, BK):
        inside = (k0 + kk) < K
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            w = tl.load(w_ptrs, mask=inside[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=inside[None, :], other=0.0)
        if NORM:
            # As add_rmsnorm: the delta rounded to the residual's dtype, the sum rounded.
            s = x.to(dt)
            if HAS_RES:
                if EVEN_K:
                    res = tl.load(r_ptrs)
                else:
                    res = tl.load(r_ptrs, mask=inside[None, :], other=0.0)
                s = (s.to(tl.float32) + res.to(tl.float32)).to(dt)
                tl.store(res_out_ptr + t.to(tl.int64)[:, None] * K + (k0 + kk)[None, :], s,
                         mask=keep_s & inside[None, :])
            if EVEN_K:
                nw = tl.load(norm_w_ptr + k0 + kk)
            else:
                nw = tl.load(norm_w_ptr + k0 + kk, mask=inside, other=0.0)
            s32 = s.to(tl.float32)
            sumsq += s32 * s32
            xv = s32 * nw.to(tl.float32)[None, :]  # [BT, BK]
        else:
            xv = x.to(tl.float32)
        acc += w.to(tl.float32)[None, :, :] * xv[:, None, :]  # [BT, 2 PAIRS, BK]
        w_ptrs += BK
        x_ptrs += BK
        r_ptrs += BK
    y = tl.sum(acc, axis=2)  # [BT, 2 PAIRS]
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(sumsq, axis=1) / K + eps)  # [BT]
        y = y * inv[:, None]
    y = y.to(dt)  # rounded as the projection's output
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


def attention_entry_suits(tokens: int, head_dim: int, tiles: EntryTiles | None = None) -> bool:
    """Whether attention_entry applies: 1..GEMV_MAX_TOKENS rows and heads
    whose rotary half is a multiple of the pairs per program."""
    tiles = tiles or EntryTiles()
    return 1 <= tokens <= GEMV_MAX_TOKENS and head_dim % 2 == 0 and (head_dim // 2) % tiles.pairs == 0


def _check(x, weight, num_heads, num_kv_heads, kv_cache, norm, tiles) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, K] with unit last stride, got {tuple(x.shape)}")
    tokens, k = x.shape
    d = kv_cache.shape[-1] if kv_cache.dim() == 6 else 0
    if not attention_entry_suits(tokens, d, tiles):
        raise ValueError(f"attention_entry takes 1..{GEMV_MAX_TOKENS} tokens and head_dim / 2 a multiple of "
                         f"{tiles.pairs}; got {tokens} tokens, head_dim {d}")
    if weight.shape != ((num_heads + 2 * num_kv_heads) * d, k) or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous [{(num_heads + 2 * num_kv_heads) * d}, {k}], "
                         f"got {tuple(weight.shape)}")
    if weight.dtype not in GEMV_DTYPES or weight.device != x.device:
        raise ValueError(f"weight must be fp16 or bf16 on {x.device}, got {weight.dtype}")
    if norm is None:
        if x.dtype != weight.dtype:
            raise ValueError(f"x must share the weight's dtype {weight.dtype}, got {x.dtype}")
        return
    if norm.weight.shape != (k,) or norm.weight.device != x.device:
        raise ValueError(f"the norm's weight must be [{k}] on {x.device}")
    if norm.residual is None:
        if x.dtype != weight.dtype:
            raise ValueError(f"x must share the weight's dtype {weight.dtype}, got {x.dtype}")
        return
    res = norm.residual
    if res.shape != x.shape or res.stride(1) != 1 or res.dtype != weight.dtype or res.device != x.device:
        raise ValueError(f"the residual must be [{tokens}, {k}] {weight.dtype} with unit last stride")
    if x.dtype not in (weight.dtype, torch.float32):
        raise ValueError(f"the delta must be {weight.dtype} or float32, got {x.dtype}")


def attention_entry(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                    kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor, num_heads: int,
                    num_kv_heads: int, norm: EntryNorm | None = None, tiles: EntryTiles | None = None,
                    pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rotated q [T, num_heads, D] contiguous, the residual stream or None);
    the rotated k and v stored at each token's slot of `layer` in kv_cache.

    x: [T, K], the normalised row (norm None) or the input of `norm` (the
    delta added to norm.residual, float32 or the weight's dtype; or the row
    itself when norm.residual is None); weight: [(num_heads + 2
    num_kv_heads) * D, K], q rows, then k, then v; positions, inv_freq,
    kv_cache, slot_mapping as kernels/rotary_cache_write.rotary_cache_write
    takes them. The second result is residual + delta (the residual stream
    after the add) when norm has a residual, x itself when norm has none,
    None without norm. Module docstring for the numerics; pdl: kernels/pdl.py.
    """
    tiles = tiles or EntryTiles()
    _check(x, weight, num_heads, num_kv_heads, kv_cache, norm, tiles)
    tokens, k = x.shape
    d = kv_cache.shape[-1]
    dtype = weight.dtype
    qo = torch.empty(tokens, num_heads, d, dtype=dtype, device=x.device)
    # rotary_cache_write's checks of the cache, positions and slots, on a view of qo's geometry.
    kv_view = qo[:, :num_kv_heads]  # [T, kv_heads, D]
    check_rotary_inputs(positions, inv_freq, qo, kv_view, kv_view, kv_cache, layer, slot_mapping)
    has_res = norm is not None and norm.residual is not None
    res = norm.residual if has_res else x
    res_out = torch.empty(tokens, k, dtype=dtype, device=x.device) if has_res else qo
    norm_w = norm.weight if norm is not None else weight
    programs = (num_heads + 2 * num_kv_heads) * (d // 2) // tiles.pairs
    _attention_entry_kernel[(programs,)](
        x, res, norm_w, res_out, weight, positions, inv_freq.float(), qo, kv_cache, slot_mapping,
        tokens, k, x.stride(0), res.stride(0), weight.stride(0), norm.eps if norm is not None else 0.0,
        num_heads, num_kv_heads, layer, kv_cache.stride(0),
        BT=triton.next_power_of_2(tokens), PAIRS=tiles.pairs, BK=tiles.block_k, HALF=d // 2,
        BS=kv_cache.shape[3], EVEN_K=k % tiles.block_k == 0, NORM=norm is not None, HAS_RES=has_res,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        **pdl_options(x.device, tokens, pdl),
    )
    if norm is None:
        return qo, None
    return qo, (res_out if has_res else x)


def attention_entry_reference(x, weight, positions, inv_freq, kv_cache, layer, slot_mapping, num_heads,
                              num_kv_heads, norm: EntryNorm | None = None):
    """The launches it replaces, in plain torch: add + RMSNorm
    (kernels/rmsnorm.py's order), the projection rounded once, then
    rotary_cache_write_reference. Same results as attention_entry."""
    dtype = weight.dtype
    stream = None
    if norm is not None:
        stream = x.to(dtype) if norm.residual is None else (norm.residual.float() + x.to(dtype).float()).to(dtype)
        x = rmsnorm_reference(stream, norm.weight, norm.eps).to(dtype)
    d = kv_cache.shape[-1]
    qkv = dense_gemv_reference(x, weight)  # [T, (hq + 2 hk) * D]
    q = qkv[:, : num_heads * d].view(-1, num_heads, d)
    k = qkv[:, num_heads * d : (num_heads + num_kv_heads) * d].view(-1, num_kv_heads, d)
    v = qkv[:, (num_heads + num_kv_heads) * d :].view(-1, num_kv_heads, d)
    qo = rotary_cache_write_reference(positions, inv_freq, q, k, v, kv_cache, layer, slot_mapping)
    return qo, stream
