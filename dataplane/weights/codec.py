"""Plain-torch reference encoder/decoder of the multi-precision layout.

This is the reference every other implementation (kernels, the paged store)
is checked against. Layout: docs/WEIGHT_LAYOUT.md (constants in layout.py).

* ``encode(W)`` quantizes an [N, K] matrix once to 8-bit group-wise codes and
  cuts them into the bit-fields of FIELD_WIDTHS, plus one (scale, offset) pair
  per (row, group) for every view.
* ``decode(block, bits)`` reconstructs the ``bits`` view from the leading fields.
* ``rtn_quantize(W, bits)`` is plain round-to-nearest min-max at ``bits``: the
  quality baseline the views are measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch

from dataplane.weights.layout import (
    CODE_BITS,
    FIELD_WIDTHS,
    GROUP,
    NIBBLE_LSB,
    NUM_FIELDS,
    QUARTER,
    TILE_ROWS,
    VIEW_BITS,
    WORD_BITS,
    check_block_shape,
    field_shift,
    field_size,
    fields_for_bits,
    padded_rows,
)

_CODE_MAX = (1 << CODE_BITS) - 1
_WORD_MASK = (1 << WORD_BITS) - 1
_INT32_SIGN = 1 << (WORD_BITS - 1)


class ScaleFit(str, Enum):
    """How each view's (scale, offset) per group is chosen."""

    MIDPOINT = "midpoint"  # middle of the truncated interval (layout default)
    LSQ = "lsq"  # least-squares refit of (scale, offset) to the group's weights


DEFAULT_SCALE_FIT = ScaleFit.LSQ  # measured: benchmarks/weights_codec.py (view error vs RTN)


class BlockBytes(Protocol):
    """One block at every precision as the weight store reads it: its shape
    and each field's byte string (codes then the view's scales). EncodedBlock
    here; block_encoder.PackedBlock from the Triton packer."""

    n: int
    k: int

    def field_bytes(self, f: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class EncodedBlock:
    """One block at every precision: fields plus per-view scales.

    fields[f]: int32 [N, K * FIELD_WIDTHS[f] / 32], packed as in the layout.
    scales[j]: float16 [N, K / GROUP, 2] = (scale, offset) of the view made by
    the first j + 1 fields (VIEW_BITS[j] bits).
    """

    n: int
    k: int
    fields: tuple[torch.Tensor, ...]
    scales: tuple[torch.Tensor, ...]

    def field_bytes(self, f: int) -> torch.Tensor:
        """Field ``f`` as the layout's byte string: codes then view-f scales. [bytes] uint8."""
        return field_to_bytes(self.fields[f], self.scales[f])


# -- packing ------------------------------------------------------------------
def quarter_bit_positions(f: int, device: torch.device | str | None = None) -> torch.Tensor:
    """int64 [QUARTER, w]: the bit, among one quarter's QUARTER * w bits of field
    ``f`` (bit p is bit p % 32 of the quarter's word p // 32), that holds bit t
    of weight i of the quarter (layout v4).

    Weight i = 8m + j is nibble j of the kernels' nibble word m, rotated by
    r = 2 (m % 2) + m // 2: its bit t sits at 4j + NIBBLE_LSB[f] + t - r
    (mod 32), in word m // 2 of a 2-bit field. A kernel masks each field
    where it lies and rotates the merged word left by r once, which puts the
    nibble's four bits at 4j .. 4j + 3 (docs/WEIGHT_LAYOUT.md).
    """
    width = FIELD_WIDTHS[f]
    i = torch.arange(QUARTER, device=device, dtype=torch.int64).unsqueeze(1)  # [QUARTER, 1]
    t = torch.arange(width, device=device, dtype=torch.int64).unsqueeze(0)  # [1, w]
    m, j = i // 8, i % 8
    rot = 2 * (m % 2) + m // 2
    word = m // 2 if width == 2 else torch.zeros_like(m)
    return WORD_BITS * word + (4 * j + NIBBLE_LSB[f] + t - rot) % WORD_BITS


def pack_field(values: torch.Tensor, f: int) -> torch.Tensor:
    """[N, K] integer codes < 2**w of field ``f`` -> int32 [N, K * w / 32] words.

    Bit t of weight i of each quarter sits at quarter_bit_positions(f)[i, t].
    """
    width = FIELD_WIDTHS[f]
    n, k = values.shape
    pos = quarter_bit_positions(f, values.device)  # [QUARTER, w]
    vals = values.to(torch.int32).reshape(n, k // QUARTER, QUARTER)  # [N, Q, 32]
    words = torch.zeros(n, k // QUARTER, width, dtype=torch.int64, device=values.device)
    for t in range(width):
        bit = ((vals >> t) & 1) << (pos[:, t] % WORD_BITS).to(torch.int32)  # [N, Q, 32]
        for word in range(width):
            hit = (pos[:, t] // WORD_BITS == word).to(torch.int32)
            words[..., word] += (bit * hit).sum(dim=-1, dtype=torch.int64)  # disjoint bits: sum == OR
    words = torch.where(words >= _INT32_SIGN, words - (1 << WORD_BITS), words)
    return words.reshape(n, -1).to(torch.int32)


def unpack_field(words: torch.Tensor, f: int) -> torch.Tensor:
    """int32 [N, J] words of field ``f`` -> int64 [N, J * 32 / w] codes (inverse of pack_field)."""
    width = FIELD_WIDTHS[f]
    n, j = words.shape
    pos = quarter_bit_positions(f, words.device)  # [QUARTER, w]
    unsigned = (words.to(torch.int64) & _WORD_MASK).reshape(n, j // width, width)  # [N, Q, w]
    codes = torch.zeros(n, j // width, QUARTER, dtype=torch.int64, device=words.device)
    for t in range(width):
        held = unsigned[..., pos[:, t] // WORD_BITS]  # [N, Q, 32]: the word holding bit t of each weight
        codes |= ((held >> (pos[:, t] % WORD_BITS)) & 1) << t
    return codes.reshape(n, -1)


def _rows_to_tiles(x: torch.Tensor) -> torch.Tensor:
    """[N, G, B] per-(row, group) items -> [N' / TILE_ROWS, G, TILE_ROWS, B], the byte
    order; N' = padded_rows(N), the padding rows zero."""
    n, g, b = x.shape
    rows = padded_rows(n)
    if rows != n:
        x = torch.cat([x, x.new_zeros(rows - n, g, b)])
    return x.reshape(rows // TILE_ROWS, TILE_ROWS, g, b).transpose(1, 2).contiguous()


def _tiles_to_rows(x: torch.Tensor, n: int, g: int) -> torch.Tensor:
    """Inverse of _rows_to_tiles on the flat items -> [N, G, B]."""
    rows = padded_rows(n)
    return x.reshape(rows // TILE_ROWS, g, TILE_ROWS, -1).transpose(1, 2).reshape(rows, g, -1)[:n]


def field_to_bytes(words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes [N, J] int32 and scales [N, G, 2] fp16 -> one uint8 byte string.

    Both parts are stored tile-major (layout v2): for each tile of TILE_ROWS
    rows, for each group, the tile's rows.
    """
    n, g = scales.shape[0], scales.shape[1]
    return torch.cat([
        _rows_to_tiles(words.reshape(n, g, -1)).view(torch.uint8).reshape(-1),
        _rows_to_tiles(scales).view(torch.uint8).reshape(-1),
    ])


def field_from_bytes(buf: torch.Tensor, n: int, k: int, f: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of field_to_bytes; ``buf`` may carry trailing page padding.

    Returns (codes int32 [N, K * w / 32], scales fp16 [N, K / GROUP, 2]).
    """
    size = field_size(n, k, f)
    if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() < size.total:
        raise ValueError(
            f"field {f} of [{n}, {k}] needs >= {size.total} uint8 bytes, got {tuple(buf.shape)} {buf.dtype}"
        )
    buf = buf[: size.total].contiguous()
    g = k // GROUP
    words = _tiles_to_rows(buf[: size.code_bytes].view(torch.int32), n, g)
    scales = _tiles_to_rows(buf[size.code_bytes :].view(torch.float16), n, g)
    return words.reshape(n, k * FIELD_WIDTHS[f] // WORD_BITS), scales


# -- quantization ---------------------------------------------------------------
def _group_min_max(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, G, GROUP] -> lo [N, G, 1], step s [N, G, 1] of the 8-bit grid, q [N, G, GROUP] int32."""
    lo = w.amin(dim=-1, keepdim=True)
    hi = w.amax(dim=-1, keepdim=True)
    # A tensor divisor: torch's CUDA division by a Python scalar multiplies by
    # its reciprocal, which is not the IEEE quotient the layout names (on an
    # H200, 0.13 % of codes then rounded the other way at ties:
    # benchmarks/results/pack_parity_s19_h200.json).
    s = (hi - lo) / torch.full_like(hi, _CODE_MAX)
    s = torch.where(hi == lo, torch.ones_like(s), s)
    q = torch.clamp(torch.round((w - lo) / s), 0, _CODE_MAX).to(torch.int32)
    return lo, s, q


def _midpoint_params(lo: torch.Tensor, s: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    drop = 1 << (CODE_BITS - bits)  # 8-bit codes per b-bit code
    return s * drop, lo + s * (drop - 1) / 2


def _lsq_params(w: torch.Tensor, t: torch.Tensor, mid_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares (scale, offset) per group for fixed codes t: minimises ||w - offset - scale*t||.

    Groups whose codes are all equal keep the midpoint scale and take the offset
    that reproduces the group mean.
    """
    t = t.to(w.dtype)
    t_mean = t.mean(dim=-1, keepdim=True)  # [N, G, 1]
    w_mean = w.mean(dim=-1, keepdim=True)
    t_c = t - t_mean
    var = (t_c * t_c).sum(dim=-1, keepdim=True)
    cov = (t_c * (w - w_mean)).sum(dim=-1, keepdim=True)
    flat = var == 0
    scale = torch.where(flat, mid_scale, cov / torch.where(flat, torch.ones_like(var), var))
    # The pair is stored in fp16: refit the offset to the rounded scale.
    scale = scale.to(torch.float16).to(w.dtype)
    offset = w_mean - scale * t_mean
    return scale, offset


def check_matrix(w: torch.Tensor) -> None:
    """Rejects what no encoder of the layout can take (ValueError): not 2-D
    [N, K], a shape the layout cannot hold, inf/nan entries."""
    if w.dim() != 2:
        raise ValueError(f"a block is a 2-D [N, K] matrix, got shape {tuple(w.shape)}")
    check_block_shape(*w.shape)
    if not torch.isfinite(w).all():
        raise ValueError("cannot quantize a matrix with inf/nan entries")


def encode(w: torch.Tensor, scale_fit: ScaleFit = DEFAULT_SCALE_FIT) -> EncodedBlock:
    """Quantizes W [N, K] (any float dtype) into an EncodedBlock (tensors on W's device)."""
    check_matrix(w)
    n, k = w.shape
    wg = w.detach().to(torch.float32).reshape(n, k // GROUP, GROUP)  # [N, G, GROUP]
    lo, s, q = _group_min_max(wg)
    fields = []
    for f, width in enumerate(FIELD_WIDTHS):
        values = (q >> field_shift(f)) & ((1 << width) - 1)  # [N, G, GROUP]
        fields.append(pack_field(values.reshape(n, k), f))
    scales = []
    for bits in VIEW_BITS:
        scale, offset = _midpoint_params(lo, s, bits)
        if scale_fit == ScaleFit.LSQ:
            scale, offset = _lsq_params(wg, q >> (CODE_BITS - bits), scale)
        scales.append(torch.cat([scale, offset], dim=-1).to(torch.float16))  # [N, G, 2]
    return EncodedBlock(n, k, tuple(fields), tuple(scales))


def decode_view(codes: Sequence[torch.Tensor], scales: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Reconstructs the view made by the leading fields ``codes`` -> float32 [N, K].

    codes[f]: int32 [N, K * FIELD_WIDTHS[f] / 32] for f < len(codes);
    scales: fp16 [N, K / GROUP, 2] of that view.
    """
    if not 1 <= len(codes) <= NUM_FIELDS:
        raise ValueError(f"a view needs 1..{NUM_FIELDS} fields, got {len(codes)}")
    bits = VIEW_BITS[len(codes) - 1]
    t = torch.zeros(n, k, dtype=torch.int64, device=scales.device)  # [N, K] b-bit codes
    for f, words in enumerate(codes):
        t |= unpack_field(words, f) << (field_shift(f) - (CODE_BITS - bits))
    sc = scales.to(torch.float32)  # [N, G, 2]
    tg = t.to(torch.float32).reshape(n, k // GROUP, GROUP)
    return (sc[..., 1:2] + sc[..., 0:1] * tg).reshape(n, k)


def decode(block: EncodedBlock, bits: int) -> torch.Tensor:
    """The ``bits`` view of ``block`` as float32 [N, K]."""
    j = fields_for_bits(bits)
    if j == 0:
        raise ValueError("bits=0 (host-only) has no view to decode")
    return decode_view(block.fields[:j], block.scales[j - 1], block.n, block.k)


def rtn_quantize(w: torch.Tensor, bits: int, group: int = GROUP) -> torch.Tensor:
    """Round-to-nearest asymmetric min-max at ``bits`` per group; returns the reconstruction (float32 [N, K]).

    Scale and offset are kept in float32 (a baseline slightly stronger than an fp16-stored one).
    """
    if w.dim() != 2 or w.shape[1] % group:
        raise ValueError(f"rtn_quantize expects [N, K] with K a multiple of {group}, got {tuple(w.shape)}")
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in 1..16, got {bits}")
    n, k = w.shape
    wg = w.detach().to(torch.float32).reshape(n, k // group, group)
    levels = (1 << bits) - 1
    lo = wg.amin(dim=-1, keepdim=True)
    hi = wg.amax(dim=-1, keepdim=True)
    s = torch.where(hi == lo, torch.ones_like(lo), (hi - lo) / levels)
    q = torch.clamp(torch.round((wg - lo) / s), 0, levels)
    return (lo + s * q).reshape(n, k)
