"""Scratch buffers of the fused MoE launches (kernels/moe_mixed.py), and what
they cost: alloc_workspace allocates them, workspace_bytes counts them for
memory planning without allocating (on the meta device). Also the two checks
both weight launches run on them (check_h_planes, settle_carveout)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
import triton

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_align import MoePrep, act_scale_columns, alloc_prep, check_planes, planes_of
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles, resident_programs
from kernels.smem_carveout import limit_carveout_once
from kernels.weight_layout import GROUP


@dataclass
class MoeWorkspace:
    prep: MoePrep
    # [T * k, split_up, 2, F] gate / up pre-activations, per K range, in sums_dtype(tiles)
    gu: torch.Tensor
    counts: torch.Tensor  # [E, F / block_n_up, m_tiles] int32, zero between launches
    h: torch.Tensor  # [T * k, F] fp16, sorted, slot order (as prep.narrow_order): plane 0
    hsum: torch.Tensor  # [T * k, F / tiles.h_sum_rows] fp32
    h_planes: torch.Tensor  # [NUM_PLANES, T * k, F] as h: h and h times plane_scales(1), (2)
    # The CUDA-core tile (tiles.activation_dtype int16): h is h quantized
    # (weight_layout.quantize_activations, pair order), h_planes [1, T * k, F].
    hq_scale: torch.Tensor  # [T * k, F / 64] fp32 scales of the int16 h ([T * k, 0] with fp16 planes)
    down_plan: torch.Tensor  # [down programs, DOWN_PLAN_FIELDS * down_plan_width(E)] int32, the down launch's scratch
    # [ready_size] int32, zero between launches: the one launch's h tiles
    # stored per (expert, tile), then its ticket and done counts
    # (kernels/moe_gate_up_down.py); with counts, one view of the counters.
    ready: torch.Tensor
    # Loaded kernels (CUfunction handles) whose carveout this workspace set.
    carveouts_set: set[int] = field(default_factory=set)
    # The second stream of a launch split into two by token class
    # (MoeTiles.gate_up_split_stages, down_split_stages) on a GPU: the wide
    # tile's launch runs beside the base tile's, so that each fills the
    # other's tail (launch_by_token_class).
    side_stream: torch.cuda.Stream | None = None


# Vectors of down_plan_width(E) slots in a row of the down launch's plan:
# work ends, first block, down fields, start and end of the sorted tokens.
DOWN_PLAN_FIELDS = 5


def down_plan_width(num_experts: int) -> int:
    """Expert slots one row of the down launch's plan holds (a power of two)."""
    return triton.next_power_of_2(max(num_experts, 16))


def sums_dtype(tiles: MoeTiles) -> torch.dtype:
    """dtype of MoeWorkspace.gu: fp16 with tiles.gate_up_sums_fp16, else fp32."""
    return torch.float16 if tiles.gate_up_sums_fp16 else torch.float32


def counts_shape(num_tokens: int, top_k: int, ffn: int, num_experts: int, tiles: MoeTiles) -> tuple[int, int, int]:
    """[E, F / block_n_up, m_tiles]: the gate/up launch's arrival counters."""
    return num_experts, ffn // tiles.block_n_up, max(1, triton.cdiv(num_tokens * top_k, tiles.block_m))


def ready_size(ffn: int, num_experts: int, tiles: MoeTiles) -> int:
    """Elements of MoeWorkspace.ready: a count per (expert, h tile), then two."""
    return num_experts * (ffn // tiles.block_n_up) + 2


def alloc_workspace(num_tokens: int, top_k: int, hidden: int, ffn: int, num_experts: int,
                    tiles: MoeTiles, device: torch.device | str,
                    counters: ArrivalCounters | None = None) -> MoeWorkspace:
    """Buffers for one call of fused_moe_mixed at these sizes. counters: where
    the arrival counters come from (a shared zeroed buffer, no fill per call);
    None allocates them zeroed."""
    pairs = num_tokens * top_k
    shape = counts_shape(num_tokens, top_k, ffn, num_experts, tiles)
    n_counts = math.prod(shape)
    n_zeroed = n_counts + ready_size(ffn, num_experts, tiles)
    # One view for both counter sets: views taken apart would overlap.
    zeroed = (counters.take((n_zeroed,), device) if counters is not None
              else torch.zeros(n_zeroed, dtype=torch.int32, device=device))
    dtype = tiles.activation_dtype
    h = torch.empty(planes_of(dtype), pairs, ffn, dtype=dtype, device=device)
    row_tiles, progs_per_tile = tiles.down_grid(num_tokens, top_k, num_experts, hidden, ffn)
    split = tiles.gate_up_split_stages or tiles.down_split_stages
    side = torch.cuda.Stream(torch.device(device)) if split and torch.device(device).type == "cuda" else None
    return MoeWorkspace(
        prep=alloc_prep(num_tokens, top_k, hidden, num_experts, device, tiles.activation_dtype,
                        tiles.narrow_order),
        gu=torch.empty(pairs, tiles.split_up, 2, ffn, dtype=sums_dtype(tiles), device=device),
        counts=zeroed[:n_counts].view(shape), ready=zeroed[n_counts:],
        h=h[0], h_planes=h, hsum=torch.empty(pairs, ffn // tiles.h_sum_rows, dtype=torch.float32, device=device),
        hq_scale=torch.empty(pairs, act_scale_columns(dtype, ffn), dtype=torch.float32, device=device),
        down_plan=torch.empty(row_tiles * progs_per_tile, DOWN_PLAN_FIELDS * down_plan_width(num_experts),
                              dtype=torch.int32, device=device),
        side_stream=side,
    )


def workspace_bytes(num_tokens: int, top_k: int, hidden: int, ffn: int, num_experts: int,
                    tiles: MoeTiles | None = None) -> int:
    """Bytes alloc_workspace takes for these sizes (0 where the fused kernels
    do not apply: hidden or ffn not a multiple of 128). tiles: default the
    launch shape fused_moe_mixed would choose."""
    if hidden % GROUP or ffn % GROUP or num_tokens <= 0:
        return 0
    tiles = tiles or choose_tiles(num_tokens, top_k, num_experts, hidden, ffn)
    ws = alloc_workspace(num_tokens, top_k, hidden, ffn, num_experts, tiles, "meta")
    parts = [getattr(ws.prep, f.name) for f in fields(ws.prep)]
    parts += [getattr(ws, f.name) for f in fields(ws)]
    # xp and h are plane 0 of x_planes and h_planes: count each buffer once.
    planes = [ws.prep.xp, ws.h]
    return sum(t.numel() * t.element_size() for t in parts
               if isinstance(t, torch.Tensor) and not any(t is p for p in planes))


def check_h_planes(ws: MoeWorkspace, tiles: MoeTiles) -> None:
    """h must be plane 0 of h_planes (the kernels reach the others from h);
    the x planes are checked by moe_prepare. Both must be of the tiles'
    activation_dtype (the tensor cores take fp16 planes, the CUDA-core tile
    int16 activations), and the x planes in their slot order
    (MoeTiles.narrow_order: gate/up writes h in the tiles' own)."""
    check_planes(ws.h_planes, ws.h, "h")
    for name, planes in (("x", ws.prep.x_planes), ("h", ws.h_planes)):
        if planes.dtype != tiles.activation_dtype:
            raise ValueError(f"{name} planes are {planes.dtype}; tiles with block_m {tiles.block_m} "
                             f"read {tiles.activation_dtype}: allocate the workspace for these tiles")
    if ws.prep.narrow_order != tiles.narrow_order:
        raise ValueError(f"x planes staged for narrow_order {ws.prep.narrow_order}; tiles with block_m "
                         f"{tiles.block_m} read narrow_order {tiles.narrow_order}: allocate the workspace "
                         f"for these tiles")


def settle_carveout(ws: MoeWorkspace, kernel, tiles: MoeTiles, by_registers: bool = False) -> None:
    """After a launch: limit the loaded kernel's carveout once (MoeTiles.limit_carveout)
    to tiles.resident_programs programs, or with by_registers to as many as
    its compiled registers allow where that is more (the gate/up launch of
    MoeTiles.gate_up_apart: 168 registers, 3 programs, against the 2 that
    resident_programs assumes without a cap)."""
    if tiles.limit_carveout and ws.h.is_cuda:
        programs = tiles.resident_programs
        if by_registers:
            programs = max(programs, resident_programs(kernel.n_regs, tiles.num_warps))
        limit_carveout_once(kernel, ws.carveouts_set, programs, ws.h.device)


def launch_by_token_class(ws: MoeWorkspace, tiles: MoeTiles, split_stages: int,
                          launch: Callable[[int, int, int, int, int, int], None]) -> None:
    """One weight launch, or two by token class (split_stages > 0: MoeTiles.
    gate_up_split_stages or down_split_stages). launch(block_m, block_m_wide,
    stages, wide_stages, tokens_lo, tokens_hi) queues one launch of those
    token tiles for the experts of over tokens_lo and at most tokens_hi tokens
    (0: no bound). Split: the experts of over block_m tokens on the wide tile
    alone, on ws.side_stream after all work queued so far (in a CUDA graph: a
    branch; without a side stream, CPU, on the current stream), beside those
    of at most block_m on the base tile at split_stages; the current stream
    then waits for both, so that each launch fills the other's tail."""
    if not split_stages:
        launch(tiles.block_m, tiles.block_m_wide, tiles.num_stages, tiles.wide_loop_stages, 0, 0)
        return
    side = ws.side_stream
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(ws.h.device))
    with torch.cuda.stream(side):  # None: the current stream
        launch(tiles.block_m_wide, 0, tiles.wide_loop_stages, tiles.wide_loop_stages, tiles.block_m, 0)
    launch(tiles.block_m, 0, split_stages, split_stages, 0, tiles.block_m)
    if side is not None:
        torch.cuda.current_stream(ws.h.device).wait_stream(side)
