"""The precision states an end-to-end decode run puts the weight store in
(benchmarks/e2e_decode.py --bits), and the bytes the experts then hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dataplane.weights.layout import NUM_PROJ, VIEW_BITS, block_index, field_size, fields_for_bits

# A mixed state: "mixed" + two view bitwidths; the wider for the blocks of
# even experts, the narrower for odd ones ("mixed26": 6/2 bits, the bytes of
# uniform 4).
MIXED_PREFIX = "mixed"


def expert_bytes(store, num_layers: int, num_experts: int) -> torch.Tensor:
    """float64 [layers, experts]: bytes of each expert's three blocks at their current bits
    (codes + scales of the resident fields, no page padding)."""
    out = torch.zeros(num_layers, num_experts, dtype=torch.float64)
    for layer in range(num_layers):
        for e in range(num_experts):
            for p in range(NUM_PROJ):
                blk = block_index(layer, e, p, num_experts)
                n, k = store.shape(blk)
                out[layer, e] += sum(field_size(n, k, f).total for f in range(fields_for_bits(store.bits(blk))))
    return out


def precision_label(store) -> str:
    bits = sorted(set(store.block_bits()))
    return str(bits[0]) if len(bits) == 1 else "mixed " + "/".join(map(str, bits))


def state_bits(state: str) -> tuple[int, int]:
    """(bits of even experts, of odd experts) of a precision state: a view
    bitwidth ("4") or MIXED_PREFIX and two of them ("mixed26": 6 bits for even
    experts, 2 for odd, whatever the digits' order)."""
    if state.startswith(MIXED_PREFIX):
        digits = state[len(MIXED_PREFIX):]
        pair = tuple(int(d) for d in digits) if digits.isdigit() else ()
        if len(pair) != 2 or any(b not in VIEW_BITS for b in pair):
            raise ValueError(f"a mixed state names two of the views {VIEW_BITS}, got {state!r}")
        return max(pair), min(pair)
    if not state.isdigit() or int(state) not in VIEW_BITS:
        raise ValueError(f"a precision state is one of the views {VIEW_BITS} or {MIXED_PREFIX}AB, got {state!r}")
    return int(state), int(state)


def set_block_bits(store, bits: Sequence[int]) -> None:
    """Puts block b at bits[b] (in block order; 0 = host-only). Demotes in
    place, promotes from the host masters and waits."""
    if len(bits) != store.num_blocks:
        raise ValueError(f"{len(bits)} bits for {store.num_blocks} blocks")
    for blk, want in enumerate(bits):
        have = store.bits(blk)
        if want < have:
            store.demote(blk, want)
        elif want > have:
            store.promote(blk, want)
    store.sync()


def set_precision(store, state: str) -> None:
    """Puts every block at ``state`` (state_bits: "mixed26" puts an expert's
    blocks at 6 bits for even experts, 2 for odd: 4 bits on average, the bytes
    of uniform 4)."""
    even, odd = state_bits(state)
    set_block_bits(store, [even if (blk // NUM_PROJ) % 2 == 0 else odd for blk in range(store.num_blocks)])
