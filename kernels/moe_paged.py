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
    page_table: torch.Tensor  # [num_blocks, 5, max_pages] int32, -1 = absent
    block_fields: torch.Tensor  # [num_blocks] int32, 0 = host-only


@triton.jit
def expert_blocks(active_ptr, bf_ptr, slot, block0):
    # The expert in `slot`, its first block (gate; up and down follow) and the
    # three blocks' resident field counts (0 = host-only).
    expert = tl.load(active_ptr + slot)
    blk = block0 + expert * 3
    return expert, blk, tl.load(bf_ptr + blk), tl.load(bf_ptr + blk + 1), tl.load(bf_ptr + blk + 2)


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

    if pt.dtype != torch.int32 or pt.dim() != 3 or pt.shape[1] != NUM_FIELDS or pt.stride(2) != 1:
        raise ValueError("page_table must be int32 [num_blocks, 5, max_pages] with unit last stride")
    if bf.dtype != torch.int32 or bf.dim() != 1 or bf.shape[0] != pt.shape[0]:
        raise ValueError("block_fields must be int32 [num_blocks]")
    if pt.shape[0] < blocks_needed:
        raise ValueError(f"page table has {pt.shape[0]} blocks, this layer needs {blocks_needed}")
    if not (storage.device == pt.device == bf.device):
        raise ValueError("storage, page_table and block_fields must be on one device")
    return page_bytes.bit_length() - 1
