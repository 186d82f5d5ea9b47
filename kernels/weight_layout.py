"""Plain-torch reference of the multi-precision weight layout (docs/WEIGHT_LAYOUT.md, v4).

The kernels' own reference: quantize one block W [N, K] to 8-bit codes, cut the
codes into the five fields, pack each field into int32 words along K, append
the per-view (scale, offset) pairs, and place the fields' bytes in arena pages
through a page table. Also the inverse (the b-bit view a kernel must compute)
and the in-group K order the MoE kernels use for activations.

Contract (v4): see docs/WEIGHT_LAYOUT.md. Rounding is round-half-to-even, the
per-view scales are the default midpoint of the truncated interval (no refit).
"""

from __future__ import annotations

import torch

GROUP = 128
FIELD_WIDTHS = (2, 1, 1, 2, 2)
VIEW_BITS = (2, 3, 4, 6, 8)
NUM_FIELDS = len(FIELD_WIDTHS)
# Bit position of each field inside the 8-bit code q (least significant bit).
FIELD_SHIFTS = tuple(8 - sum(FIELD_WIDTHS[: f + 1]) for f in range(NUM_FIELDS))
CODE_MAX = 255
SCALE_BYTES_PER_GROUP = 4  # float16 scale + float16 offset
# Rows per tile of a field's byte string (v2): the bytes of one (tile, group)
# are one contiguous run, so a kernel step over 64 rows reads whole runs.
TILE_ROWS = 64


def view_bits(num_fields: int) -> int:
    """Bitwidth of the view made of the first ``num_fields`` fields."""
    if not 1 <= num_fields <= NUM_FIELDS:
        raise ValueError(f"num_fields must be in 1..{NUM_FIELDS}, got {num_fields}")
    return VIEW_BITS[num_fields - 1]


def fields_for_bits(bits: int) -> int:
    """Number of fields of the ``bits``-bit view."""
    if bits not in VIEW_BITS:
        raise ValueError(f"bits must be one of {VIEW_BITS}, got {bits}")
    return VIEW_BITS.index(bits) + 1


def field_code_bytes(field: int, n: int, k: int) -> int:
    """Bytes of the packed codes of one field of an [n, k] block (whole tiles)."""
    return padded_rows(n) * k * FIELD_WIDTHS[field] // 8


def field_bytes(field: int, n: int, k: int) -> int:
    """Bytes of one field's byte string: packed codes then the view's scales."""
    return field_code_bytes(field, n, k) + padded_rows(n) * (k // GROUP) * SCALE_BYTES_PER_GROUP


def _check_block(w: torch.Tensor) -> None:
    if w.dim() != 2:
        raise ValueError(f"a block is 2-D [N, K], got shape {tuple(w.shape)}")
    if w.shape[1] % GROUP:
        raise ValueError(f"K must be a multiple of {GROUP}, got {w.shape[1]}")


def padded_rows(n: int) -> int:
    """Rows a field's byte string holds: n rounded up to whole 64-row tiles."""
    return -(-n // TILE_ROWS) * TILE_ROWS


def rows_to_tiles(x: torch.Tensor) -> torch.Tensor:
    """[N, G, B] per-(row, group) items -> [N' / 64, G, 64, B]: the byte order
    (tile-major since v2; N' = padded_rows(N), padding rows zero)."""
    n, g, b = x.shape
    rows = padded_rows(n)
    if rows != n:
        x = torch.cat([x, x.new_zeros(rows - n, g, b)])
    return x.reshape(rows // TILE_ROWS, TILE_ROWS, g, b).transpose(1, 2).contiguous()


def tiles_to_rows(x: torch.Tensor, n: int, g: int) -> torch.Tensor:
    """Inverse of rows_to_tiles: flat items in tile-major order -> [N, G, B]."""
    rows = padded_rows(n)
    return x.reshape(rows // TILE_ROWS, g, TILE_ROWS, -1).transpose(1, 2).reshape(rows, g, -1)[:n]


def quantize_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8-bit codes of one block: (q uint8 [N, K], lo fp32 [N, G], s fp32 [N, G])."""
    _check_block(w)
    n, k = w.shape
    wg = w.float().reshape(n, k // GROUP, GROUP)  # [N, G, 128]
    lo = wg.amin(dim=-1)  # [N, G]
    hi = wg.amax(dim=-1)
    s = (hi - lo) / CODE_MAX
    s = torch.where(hi == lo, torch.ones_like(s), s)
    q = torch.clamp(torch.round((wg - lo[..., None]) / s[..., None]), 0, CODE_MAX)
    return q.to(torch.uint8).reshape(n, k), lo, s


def view_scales(lo: torch.Tensor, s: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Default (scale_b, offset_b) of the b-bit view, float16 [N, G] each."""
    step = float(2 ** (8 - bits))
    scale = s * step
    offset = lo + s * (step - 1.0) / 2.0
    return scale.to(torch.float16), offset.to(torch.float16)


# Bit of a 4-bit nibble where each field's least significant bit lands when a
# kernel rebuilds the top (fields 0-2) or the bottom (fields 3-4) four bits of
# a code (v4).
NIBBLE_LSB = (2, 1, 0, 2, 0)
QUARTER = 32  # weights per quarter of a group: what one kernel thread decodes per row


def quarter_bit_positions(field: int) -> torch.Tensor:
    """int64 [32, w]: where bit t of weight i of a quarter lies among the
    quarter's 32 w bits of field ``field`` (bit p is bit p % 32 of the
    quarter's word p // 32).

    v4: weight i = 8m + j is nibble j of nibble word m, whose rotation is
    r = 2 (m % 2) + m // 2; a 2-bit field keeps m in its word m // 2, a 1-bit
    field all four in its one word, at bits 4j + NIBBLE_LSB[field] + t - r
    (mod 32). A kernel takes each field where it lies (one mask) and rotates
    the merged word left by r, which puts nibble j at bits 4j .. 4j + 3.
    """
    width = FIELD_WIDTHS[field]
    i = torch.arange(QUARTER, dtype=torch.int64)[:, None]
    t = torch.arange(width, dtype=torch.int64)[None, :]
    m, j = i // 8, i % 8
    r = 2 * (m % 2) + m // 2
    word = m // 2 if width == 2 else torch.zeros_like(m)
    return 32 * word + (4 * j + NIBBLE_LSB[field] + t - r) % 32


def pack_field(q: torch.Tensor, field: int) -> torch.Tensor:
    """Field ``field`` of codes q [N, K] as int32 words [N, K * w / 32] (rows in
    order; the byte string stores them tile-major, see pack_block)."""
    width = FIELD_WIDTHS[field]
    n, k = q.shape
    vals = (q.to(torch.int64) >> FIELD_SHIFTS[field]) & ((1 << width) - 1)
    bits = (vals.reshape(n, k // QUARTER, QUARTER, 1) >> torch.arange(width, device=q.device)) & 1
    pos = quarter_bit_positions(field).to(q.device).reshape(-1)  # a permutation of the quarter's bits
    placed = torch.zeros(n, k // QUARTER, QUARTER * width, dtype=torch.int64, device=q.device)
    placed[..., pos] = bits.reshape(n, k // QUARTER, -1)
    words = (placed.reshape(n, -1, 32) << torch.arange(32, device=q.device)).sum(dim=-1)  # disjoint bits
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def pack_block(w: torch.Tensor) -> list[torch.Tensor]:
    """The five fields' byte strings (uint8 1-D each) of one block W [N, K]."""
    q, lo, s = quantize_codes(w)
    out = []
    for f in range(NUM_FIELDS):
        scale, offset = view_scales(lo, s, VIEW_BITS[f])
        n, g = lo.shape
        codes = rows_to_tiles(pack_field(q, f).reshape(n, g, -1)).reshape(-1).view(torch.uint8)
        pairs = rows_to_tiles(torch.stack([scale, offset], dim=-1)).reshape(-1).view(torch.uint8)
        out.append(torch.cat([codes, pairs]))
    return out


def unpack_field(data: torch.Tensor, field: int, n: int, k: int) -> torch.Tensor:
    """Field values int64 [N, K] from one field's byte string."""
    width = FIELD_WIDTHS[field]
    nbytes = field_code_bytes(field, n, k)
    words = tiles_to_rows(data[:nbytes].view(torch.int32), n, k // GROUP).to(torch.int64) & 0xFFFFFFFF
    bits = (words.reshape(n, k // QUARTER, width, 1) >> torch.arange(32, device=data.device)) & 1
    pos = quarter_bit_positions(field).to(data.device)  # [32, w]
    held = bits.reshape(n, k // QUARTER, QUARTER * width)[..., pos.reshape(-1)].reshape(n, k // QUARTER, QUARTER, width)
    return (held << torch.arange(width, device=data.device)).sum(dim=-1).reshape(n, k)


def unpack_scales(data: torch.Tensor, field: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, offset) float16 [N, G] stored in one field's byte string."""
    start = field_code_bytes(field, n, k)
    end = start + padded_rows(n) * (k // GROUP) * SCALE_BYTES_PER_GROUP
    pairs = tiles_to_rows(data[start:end].view(torch.float16), n, k // GROUP)
    return pairs[..., 0], pairs[..., 1]


def dequantize_view(fields: list[torch.Tensor], num_fields: int, n: int, k: int) -> torch.Tensor:
    """W_b fp32 [N, K] of the view made of the first ``num_fields`` fields."""
    bits = view_bits(num_fields)
    code = torch.zeros(n, k, dtype=torch.int64, device=fields[0].device)
    for f in range(num_fields):
        code |= unpack_field(fields[f], f, n, k) << (FIELD_SHIFTS[f] - (8 - bits))
    scale, offset = unpack_scales(fields[num_fields - 1], num_fields - 1, n, k)
    scale = scale.float().repeat_interleave(GROUP, dim=1)
    offset = offset.float().repeat_interleave(GROUP, dim=1)
    return offset + scale * code.float()


# -- K order inside one group, as the MoE kernels decode it --------------------
# The kernels decode, per row and per group of 128, one quarter (32 weights)
# per thread into fp16 pairs, which is what the thread holds of the mma A
# operand; the dot product does not care about K order, so the activations
# are stored in the decoded ("virtual") order instead of moving weights.
# Virtual index v = w*64 + h*32 + s*16 + ab*8 + c*2 + e holds actual index
# a = 32c + 16w + 8h + 2s + ab + 4e: quarter c, nibble word m = 2w + h,
# nibble j = 2s + ab + 4e (pair (s, ab) of the word, half e of the pair).
def virtual_to_actual() -> torch.Tensor:
    """int64 [128]: actual in-group index of each virtual position."""
    v = torch.arange(GROUP)
    w, h, s, ab, c, e = v // 64, (v // 32) % 2, (v // 16) % 2, (v // 8) % 2, (v // 2) % 4, v % 2
    return 32 * c + 16 * w + 8 * h + 2 * s + ab + 4 * e


# The activation planes hold each group in a "slot order" that the token
# tile's decode produces: the virtual order itself for the tiles multiplied by
# wgmma (16 tokens and up), and for the 8-token tile (mma.sync, whose A
# operand Triton lays out with kWidth 4: kernels/moe_decode.tile_k_order)
# slot 64w + 32h + 16s + 4c + 2ab + e holding virtual position
# 64w + 32h + 16s + 8ab + 2c + e. Staged so, a launch reads its activation
# rows contiguously (a permuted gather there kept Triton 3.6 from copying them
# by cp.async: 8 more global loads a step in the loop).
def slot_virtual(narrow: bool = False) -> torch.Tensor:
    """int64 [128]: the virtual position at each slot of the planes' in-group
    order (narrow: the 8-token tile's)."""
    j = torch.arange(GROUP)
    if not narrow:
        return j
    return (j & 0x71) | ((j & 0x2) << 2) | (((j >> 2) & 0x3) << 1)


# Each view's decode reads a weight as the subnormal fp16 t 2^p 2^-24, its
# code t at place p of its half (kernels/moe_decode.py); the activations of
# that view are staged times 2^-p, in one of three planes: 6 and 8 bits read
# bytes at p = 0 (plane 0, x itself), 3 and 4 bits nibbles at p = 4 ab
# (plane 1), 2 bits field 0 in place at p = 4 ab + 2 (1 - h) (plane 2).
NUM_PLANES = 3


def view_plane(num_fields: int) -> int:
    """Activation plane the view of ``num_fields`` fields reads."""
    view_bits(num_fields)
    return 2 if num_fields == 1 else 1 if num_fields <= 3 else 0


def plane_scales(plane: int, narrow: bool = False) -> torch.Tensor:
    """fp32 [128]: 2^-p of each slot in activation plane ``plane`` (in the
    slot order: slot_virtual(narrow))."""
    if plane not in range(NUM_PLANES):
        raise ValueError(f"plane must be in 0..{NUM_PLANES - 1}, got {plane}")
    v = slot_virtual(narrow)
    h, ab = (v // 32) % 2, (v // 8) % 2
    p = torch.zeros(GROUP, dtype=torch.int64) if plane == 0 else 4 * ab if plane == 1 else 4 * ab + 2 * (1 - h)
    return torch.pow(2.0, -p.float())


def permute_groups(x: torch.Tensor, narrow: bool = False) -> torch.Tensor:
    """x [..., K] reordered inside each group of 128 into the kernels' slot
    order (slot_virtual(narrow))."""
    k = x.shape[-1]
    if k % GROUP:
        raise ValueError(f"last dim must be a multiple of {GROUP}, got {k}")
    idx = virtual_to_actual()[slot_virtual(narrow)].to(x.device)
    g = torch.arange(k // GROUP, device=x.device)[:, None] * GROUP
    return x[..., (g + idx[None, :]).reshape(-1)]


# -- placing fields in pages (test and benchmark scaffolding) ------------------
def pages_for(nbytes: int, page_bytes: int) -> int:
    return -(-nbytes // page_bytes)


def write_field_pages(storage: torch.Tensor, pages: list[int], data: torch.Tensor) -> None:
    """Copies one field's byte string into arena pages (last page zero-padded)."""
    page_bytes = storage.shape[1]
    if len(pages) != pages_for(data.numel(), page_bytes):
        raise ValueError("wrong number of pages for this byte string")
    for i, page in enumerate(pages):
        chunk = data[i * page_bytes : (i + 1) * page_bytes]
        storage[page].zero_()
        storage[page, : chunk.numel()].copy_(chunk)


def place_blocks(fields: list[list[torch.Tensor]], resident: list[int], storage: torch.Tensor,
                 alloc) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes each block's first ``resident[b]`` fields into pages of ``storage``.

    fields[b]: the block's five byte strings; alloc(n) -> n free page indices
    (e.g. dataplane Arena.alloc bound to a tag). Returns (page_table int64
    [num_blocks, 5, max_pages], block_fields int32 [num_blocks]) on storage's
    device; absent entries are -1.
    """
    page_bytes = storage.shape[1]
    max_pages = max((pages_for(f.numel(), page_bytes) for blk in fields for f in blk), default=1)
    table = torch.full((len(fields), NUM_FIELDS, max_pages), -1, dtype=torch.int64)
    for b, (blk, nf) in enumerate(zip(fields, resident)):
        for f in range(nf):
            pages = alloc(pages_for(blk[f].numel(), page_bytes))
            write_field_pages(storage, pages, blk[f].to(storage.device))
            table[b, f, : len(pages)] = torch.tensor(pages, dtype=torch.int64)
    counts = torch.tensor(resident, dtype=torch.int32)
    return table.to(storage.device), counts.to(storage.device)


# -- activations of the one-token (CUDA-core) product --------------------------
# The one-token tile (kernels/moe_cuda_core.py) multiplies code bytes with
# int16 activations by the integer dot product dp2a (two int16 times two
# bytes, accumulated in int32). Activations are quantized per span of 64
# (half a group; one gate/up program of 64 rows sees a whole span of h):
# q = round(x * ACT_QMAX / amax) with one fp32 scale amax / ACT_QMAX per
# span, and stored in "pair order": inside each 8 consecutive K the even ones
# first, then the odd ones (x0 x2 x4 x6 x1 x3 x5 x7), so that each 32-bit word
# of activations meets the two bytes of a code word dp2a pairs it with.
ACT_QMAX = 32767
ACT_SPAN = 64


def pair_order() -> torch.Tensor:
    """int64 [8]: the in-8 index stored at each position of the pair order."""
    pos = torch.arange(8)
    return 2 * (pos % 4) + pos // 4


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q int16 [..., K] in pair order, scale fp32 [..., K / 64]):
    x ~ q * scale (round half to even; a span of zeros gets scale 0)."""
    k = x.shape[-1]
    if k % ACT_SPAN:
        raise ValueError(f"last dim must be a multiple of {ACT_SPAN}, got {k}")
    spans = x.float().reshape(*x.shape[:-1], k // ACT_SPAN, ACT_SPAN)
    amax = spans.abs().amax(dim=-1)
    ratio = torch.where(amax > 0, ACT_QMAX / amax, torch.zeros_like(amax))
    q = torch.round(spans * ratio[..., None]).clamp(-ACT_QMAX, ACT_QMAX).reshape(*x.shape[:-1], k // 8, 8)
    return q[..., pair_order().to(x.device)].reshape(x.shape).to(torch.int16), amax / ACT_QMAX


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_activations up to rounding: fp32 [..., K] in K order."""
    k = q.shape[-1]
    inverse = torch.argsort(pair_order()).to(q.device)
    x = q.float().reshape(*q.shape[:-1], k // 8, 8)[..., inverse].reshape(*q.shape[:-1], k // ACT_SPAN, ACT_SPAN)
    return (x * scale[..., None]).reshape(q.shape)
