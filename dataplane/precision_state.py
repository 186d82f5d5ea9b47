"""How the precision of expert weights is reported, before a weight store exists.

The telemetry client asks a ``PrecisionReporter`` for the supported bitwidths,
each projection's footprint per bitwidth, and the current bits of every block.
Until the multi-precision weight store replaces it, ``StaticPrecision`` reports
every block at 8 bits (the quality ceiling), the only supported width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

GROUP_SIZE = 128  # quantisation group along the input dim (docs/WEIGHT_LAYOUT.md)
SCALE_BYTES_PER_GROUP = 4  # float16 scale + float16 offset
PROJECTIONS = ("gate", "up", "down")  # order of block_bits' last axis


@dataclass(frozen=True)
class Footprint:
    """GPU bytes one block of a projection takes at ``bits`` (0 = host-only)."""

    projection: str  # "gate", "up" or "down"
    bits: int
    bytes: int


@dataclass(frozen=True)
class PrecisionCounters:
    """Precision activity since the previous call (telemetry deltas)."""

    predicted_quality_cost: float = 0.0
    demotions: int = 0
    promotions: int = 0
    host_reads: int = 0
    host_read_bytes: int = 0
    plan_id: int = 0


class PrecisionReporter(Protocol):
    """Called from the telemetry thread: implementations must be thread-safe."""

    def supported_bits(self) -> list[int]:
        """Bitwidths the weight store can hold, ascending."""
        ...

    def footprints(self) -> list[Footprint]:
        """Per projection: one entry per supported bitwidth plus bits=0."""
        ...

    def block_bits(self) -> list[int]:
        """Current bits of every block, row-major [layers, experts, 3] (gate, up, down)."""
        ...

    def take_counters(self) -> PrecisionCounters:
        """Activity since the last call, and the plan being followed."""
        ...


def block_bytes_at(out_features: int, in_features: int, bits: int, page_bytes: int) -> int:
    """Codes + one scale/offset pair per group of one [out, in] block at ``bits``, in pages.

    An estimate for ``StaticPrecision``; the weight store reports its exact
    footprints (each resident field carries its own scales).
    """
    if bits == 0:
        return 0
    raw = out_features * in_features * bits // 8
    raw += out_features * (in_features // GROUP_SIZE) * SCALE_BYTES_PER_GROUP
    return -(-raw // page_bytes) * page_bytes


class StaticPrecision:
    """Every block at 8 bits, forever (no weight store yet)."""

    BITS = 8

    def __init__(self, num_layers: int, num_experts: int, hidden_size: int, ffn_size: int, page_bytes: int) -> None:
        self._num_blocks = num_layers * num_experts * len(PROJECTIONS)
        shapes = {"gate": (ffn_size, hidden_size), "up": (ffn_size, hidden_size), "down": (hidden_size, ffn_size)}
        self._footprints = [
            Footprint(proj, bits, block_bytes_at(*shapes[proj], bits, page_bytes))
            for proj in PROJECTIONS
            for bits in (0, self.BITS)
        ]

    def supported_bits(self) -> list[int]:
        return [self.BITS]

    def footprints(self) -> list[Footprint]:
        return list(self._footprints)

    def block_bits(self) -> list[int]:
        return [self.BITS] * self._num_blocks

    def take_counters(self) -> PrecisionCounters:
        return PrecisionCounters()
