"""Constants and byte sizes of the multi-precision weight layout (v4).

The contract is docs/WEIGHT_LAYOUT.md; this module is its executable form and
the only place the numbers live. Kernels import from here.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUT_VERSION = 4
GROUP = 128  # weights per quantization group, along the input dimension K
# v2: a field's byte string holds its rows in tiles of TILE_ROWS (the last one
# zero-padded); the bytes of one (tile, group) are contiguous (docs/WEIGHT_LAYOUT.md).
TILE_ROWS = 64
CODE_BITS = 8  # bits of the full code q
# Field widths, most significant first; the first j fields form the view of
# VIEW_BITS[j - 1] bits.
FIELD_WIDTHS: tuple[int, ...] = (2, 1, 1, 2, 2)
NUM_FIELDS = len(FIELD_WIDTHS)
VIEW_BITS: tuple[int, ...] = tuple(sum(FIELD_WIDTHS[: j + 1]) for j in range(NUM_FIELDS))
WORD_BITS = 32  # fields are packed into int32 words
# v4: the bit of a 4-bit nibble that each field's least significant bit takes
# when a kernel merges fields 0-2 (the top four code bits) or 3-4 (the bottom
# four) into nibble words; the in-word order follows from it (codec.py).
NIBBLE_LSB: tuple[int, ...] = (2, 1, 0, 2, 0)
QUARTER = 32  # weights per quarter of a group, the unit of the in-word order
SCALE_BYTES = 2  # float16
SCALE_PAIR = 2  # (scale, offset) per (row, group, view)
NUM_PROJ = 3  # gate (w1), up (w3), down (w2)
PROJ_GATE, PROJ_UP, PROJ_DOWN = 0, 1, 2
HOST_ONLY_BITS = 0  # bits reported for a block with no resident field

assert sum(FIELD_WIDTHS) == CODE_BITS


def field_shift(f: int) -> int:
    """Bit position of field ``f``'s least significant bit inside the code q."""
    return CODE_BITS - sum(FIELD_WIDTHS[: f + 1])


def fields_for_bits(bits: int) -> int:
    """Number of leading fields that make the ``bits`` view (0 for host-only)."""
    if bits == HOST_ONLY_BITS:
        return 0
    if bits not in VIEW_BITS:
        raise ValueError(f"unsupported bitwidth {bits}; supported: {VIEW_BITS} or 0 (host-only)")
    return VIEW_BITS.index(bits) + 1


def bits_for_fields(num_fields: int) -> int:
    """Bits of the view made by the first ``num_fields`` fields (0 = host-only)."""
    if not 0 <= num_fields <= NUM_FIELDS:
        raise ValueError(f"field count {num_fields} outside 0..{NUM_FIELDS}")
    return HOST_ONLY_BITS if num_fields == 0 else VIEW_BITS[num_fields - 1]


def block_index(layer: int, expert: int, proj: int, num_experts: int) -> int:
    """Global block index: ((layer * num_experts + expert) * 3 + proj)."""
    return (layer * num_experts + expert) * NUM_PROJ + proj


def check_block_shape(n: int, k: int) -> None:
    """Rejects shapes the layout cannot hold, with a clear message."""
    if n <= 0 or k <= 0:
        raise ValueError(f"block shape must be positive, got [{n}, {k}]")
    if k % GROUP:
        raise ValueError(
            f"block input dimension K={k} is not a multiple of the group size {GROUP}; "
            "the multi-precision layout cannot hold this matrix"
        )


@dataclass(frozen=True)
class FieldSize:
    """Bytes of one field of an [n, k] block: packed codes, then view scales."""

    code_bytes: int
    scale_bytes: int

    @property
    def total(self) -> int:
        return self.code_bytes + self.scale_bytes


def padded_rows(n: int) -> int:
    """Rows a field's byte string holds: n rounded up to whole tiles."""
    return -(-n // TILE_ROWS) * TILE_ROWS


def expert_tile_bytes(hidden: int, ffn: int) -> int:
    """Bytes of the widest field tile (64 rows, widest field) of an expert's blocks."""
    return TILE_ROWS * max(hidden, ffn) * max(FIELD_WIDTHS) // 8


def field_size(n: int, k: int, f: int) -> FieldSize:
    check_block_shape(n, k)
    rows = padded_rows(n)
    return FieldSize(
        code_bytes=rows * k * FIELD_WIDTHS[f] // 8,
        scale_bytes=rows * (k // GROUP) * SCALE_PAIR * SCALE_BYTES,
    )


def pages_for(nbytes: int, page_bytes: int) -> int:
    return -(-nbytes // page_bytes)
