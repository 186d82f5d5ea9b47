"""The paged expert weights as the fused MoE launches see them
(docs/WEIGHT_LAYOUT.md): the device tables, their checks, and how a launch
finds an expert's blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.weight_layout import FIELD_WIDTHS, NUM_FIELDS, TILE_ROWS

PROJ_GATE, PROJ_UP, PROJ_DOWN = 0, 1, 2
PROJS_PER_EXPERT = 3


@dataclass(frozen=True)
class PagedWeights:
    """Device view of the weight store (docs/WEIGHT_LAYOUT.md)."""

    storage: torch.Tensor  # [num_pages, page_bytes] uint8, the arena
    # [num_blocks, 5, max_pages] int64 page offsets from storage's base: an
    # arena page, or a host page (pinned, mapped) of a block read in place
    page_table: torch.Tensor
    block_fields: torch.Tensor  # [num_blocks] int32 fields the kernels read (0: absent, skipped)


@triton.jit
def token_class_bounds(start, end, TOKENS_LO: tl.constexpr, TOKENS_HI: tl.constexpr):
    """(lo, hi) such that an expert of sorted tokens [start, end) is in the
    launch's token class iff lo < end <= hi: over TOKENS_LO and at most
    TOKENS_HI tokens (each 0: no bound; MoeTiles.gate_up_split_stages,
    down_split_stages). Without bounds: start < end <= end."""
    lo = start
    if TOKENS_LO > 0:
        lo = start + TOKENS_LO
    hi = end
    if TOKENS_HI > 0:
        hi = start + TOKENS_HI
    return lo, hi


@triton.jit
def slot_expert(active_ptr, bf_ptr, offsets_ptr, slot, block0, E):
    """The expert in `slot` (0 <= slot < E; a scalar or a vector of slots),
    its first block (gate; up and down follow), the three blocks' resident
    field counts and its range [start, end) of the sorted
    list. The loads go through the L2 (.cg), so that a launch may issue them
    before its PDL wait (kernels/pdl.py; the down launch does).

    Issued without waiting for num_active, so that the launch's first loads
    form two rounds (the slot's expert, then its tables) instead of four
    (ncu stall sampling of the one-token gate/up launch: the prologue's
    chain of dependent loads held ~7 % of the warps' samples,
    benchmarks/results/moe_ncu_b1_stalls_s21_h200.json). Slots at or past
    num_active hold stale ids (the prep writes the active ones only): the id
    is clamped into [0, E) so that every load stays in bounds, and the
    caller must ignore such slots.
    """
    expert = tl.minimum(tl.maximum(tl.load(active_ptr + slot, cache_modifier=".cg"), 0), E - 1)
    blk = block0 + expert * 3
    nf_g = tl.load(bf_ptr + blk, cache_modifier=".cg")
    nf_u = tl.load(bf_ptr + blk + 1, cache_modifier=".cg")
    nf_d = tl.load(bf_ptr + blk + 2, cache_modifier=".cg")
    return (expert, blk, nf_g, nf_u, nf_d, tl.load(offsets_ptr + expert, cache_modifier=".cg"),
            tl.load(offsets_ptr + expert + 1, cache_modifier=".cg"))


def check_weights(weights: PagedWeights, hidden: int, ffn: int, blocks_needed: int) -> int:
    """log2(page bytes) after checking the tables' types, shapes and devices
    against a layer of these sizes."""
    storage, pt, bf = weights.storage, weights.page_table, weights.block_fields
    if storage.dtype != torch.uint8 or storage.dim() != 2 or not storage.is_contiguous():
        raise ValueError("storage must be a contiguous uint8 [num_pages, page_bytes] tensor")
    page_bytes = storage.shape[1]
    if page_bytes & (page_bytes - 1):
        raise ValueError(f"page_bytes must be a power of two, got {page_bytes}")
    widest_tile = TILE_ROWS * max(hidden, ffn) * max(FIELD_WIDTHS) // 8
    if page_bytes < widest_tile:
        raise ValueError(f"page_bytes {page_bytes} < widest packed tile {widest_tile} (64 rows): "
                         "tiles would span >2 pages")

    if pt.dtype != torch.int64 or pt.dim() != 3 or pt.shape[1] != NUM_FIELDS or pt.stride(2) != 1:
        raise ValueError("page_table must be int64 [num_blocks, 5, max_pages] with unit last stride")
    if bf.dtype != torch.int32 or bf.dim() != 1 or bf.shape[0] != pt.shape[0]:
        raise ValueError("block_fields must be int32 [num_blocks]")
    if pt.shape[0] < blocks_needed:
        raise ValueError(f"page table has {pt.shape[0]} blocks, this layer needs {blocks_needed}")
    if not (storage.device == pt.device == bf.device):
        raise ValueError("storage, page_table and block_fields must be on one device")
    return page_bytes.bit_length() - 1
