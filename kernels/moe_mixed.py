"""Fused mixed-precision MoE layer over paged multi-precision expert weights.

Three launches per layer (four with a split gate/up, below), no host sync
(CUDA-graph friendly); their shapes come from kernels/moe_tiles.py:
1. moe_prepare (kernels/moe_align.py): sort (token, slot) pairs by expert,
   stage x as fp16 in the kernels' K order with per-group sums, zero the output;
2. run_gate_up (kernels/moe_gate_up.py): per (expert, rows of F): gate and
   up projections of the expert's tokens, SiLU(gate) * up, stored as fp16 h
   in sorted order (and per-tile sums of h for the next launch's group
   offsets); with MoeTiles.gate_up_apart the SiLU product is a launch of its
   own (kernels/moe_combine.py);
3. run_down (kernels/moe_down.py): per (expert, rows of H, share of K): down
   projection of h, times the routing weight, atomically added into out
   [T, H] fp32 (the weighted sum over the top-k and the K split in one go).
At one token, launches 2 and 3 may run as one (MoeTiles.one_launch,
kernels/moe_gate_up_down.py); with a wide tile, launch 2 may run as two, one
per token tile (MoeTiles.gate_up_split_stages).

fused_moe_from_residual replaces launch 1 at decode sizes with
kernels/moe_entry.py, which also does the residual add and norm before the
layer and its router (fused_moe_mixed takes x and the routing as inputs).

Each block (one projection of one expert) is read through the page table at its
own bitwidth: the kernels read block_fields[block] and branch into a decode
specialised for that many fields, so blocks at different bits share a launch.
Blocks with block_fields == 0 are skipped: an expert contributes only when
its three blocks are readable. (The weight store never leaves a block so: a
host-only block's rows name its master's host pages, read in place, at
NUM_FIELDS fields.)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kernels.arrival_counters import ArrivalCounters
from kernels.moe_align import moe_prepare
from kernels.moe_down import run_down
from kernels.moe_entry import moe_entry
from kernels.moe_gate_up import run_gate_up
from kernels.moe_gate_up_down import run_gate_up_down
from kernels.moe_paged import PROJ_DOWN, PROJ_GATE, PROJ_UP, PROJS_PER_EXPERT, PagedWeights, check_weights
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import DEFAULT_SMS, MoeTiles
from kernels.moe_tuning import MoeTuning
from kernels.moe_workspace import MoeWorkspace, alloc_workspace
from kernels.pdl import DEFAULT_PDL, PdlPolicy
from kernels.router import RoutingTargets
from kernels.weight_layout import GROUP, dequantize_view, field_bytes, pages_for

__all__ = ["PagedWeights", "PROJS_PER_EXPERT", "alloc_workspace", "fused_moe_from_residual", "fused_moe_mixed",
           "moe_mixed_reference",
           "dequantized_block", "read_block", "run_down", "run_gate_up"]


def fused_moe_mixed(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    weights: PagedWeights, layer: int, num_experts: int, ffn: int,
                    tiles: MoeTiles | None = None, workspace: MoeWorkspace | None = None,
                    counters: ArrivalCounters | None = None, tuning: MoeTuning | None = None,
                    pdl: PdlPolicy = DEFAULT_PDL, distinct_ids: bool = False) -> torch.Tensor:
    """MoE layer output fp32 [T, H] = sum_j w[t, j] * expert_{ids[t, j]}(x[t]).

    x: [T, H] fp16/bf16/fp32 (cast to fp16 for the tensor cores, clamped);
    topk_ids: [T, k] int (ids outside [0, E) are ignored); topk_weights: [T, k];
    weights: the arena and device tables; blocks ((layer * E + e) * 3 + proj).
    workspace: buffers from alloc_workspace (reused across calls and CUDA
    graphs); the result is workspace.prep.out. counters: the shared zeroed
    arrival counters of a workspace allocated here (kernels/arrival_counters.py;
    None: zeroed per call). tiles: the launch shape (None: choose_tiles with
    tuning, itself None: MoeTuning()). pdl: which launches take part in PDL
    (kernels/pdl.py). distinct_ids: the caller vouches that each row of
    topk_ids holds distinct ids (a router's top-k), so that tiles chosen here
    may take MoeTiles.gate_up_apart, whose grid holds T pairs per expert
    (given tiles with it need the same). Three launches or more, no host sync.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got {tuple(x.shape)}")
    t, hidden = x.shape
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError("topk_ids and topk_weights must both be [T, k]")
    top_k = topk_ids.shape[1]
    workspace, tiles, log2p, down_fields = _layer_setup(t, top_k, hidden, weights, layer, num_experts, ffn,
                                                        x.device, tiles, workspace, counters, tuning, distinct_ids)
    if t == 0:
        return workspace.prep.out
    moe_prepare(x, topk_ids, num_experts, workspace.prep, down_fields, pdl)
    _run_projections(workspace, topk_weights, weights, layer, num_experts, top_k, ffn, tiles, log2p, pdl)
    return workspace.prep.out


def fused_moe_from_residual(delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                            gate_weight: torch.Tensor, top_k: int, weights: PagedWeights, layer: int,
                            num_experts: int, ffn: int, counters: ArrivalCounters,
                            targets: RoutingTargets | None = None,
                            tuning: MoeTuning | None = None,
                            pdl: PdlPolicy = DEFAULT_PDL) -> tuple[torch.Tensor, torch.Tensor]:
    """(MoE layer output fp32 [T, H], residual + delta): fused_moe_mixed of
    x = RMSNorm(residual + delta) routed by gate_weight, its first launch
    kernels/moe_entry.py (residual add, norm, router and prep in one). Where
    moe_entry_suits; arguments as moe_entry's and fused_moe_mixed's.
    """
    if residual.dim() != 2 or gate_weight.dim() != 2 or gate_weight.shape[0] != num_experts:
        raise ValueError(f"need residual [T, H] and gate_weight [{num_experts}, H]")
    t, hidden = residual.shape
    workspace, tiles, log2p, down_fields = _layer_setup(t, top_k, hidden, weights, layer, num_experts, ffn,
                                                        residual.device, None, None, counters, tuning, True)
    res_out, _, topk_weights = moe_entry(delta, residual, norm_weight, eps, gate_weight, top_k, workspace.prep,
                                         counters, targets, down_fields, pdl)
    if t:
        _run_projections(workspace, topk_weights, weights, layer, num_experts, top_k, ffn, tiles, log2p, pdl)
    return workspace.prep.out, res_out


def _run_projections(workspace: MoeWorkspace, topk_weights: torch.Tensor, weights: PagedWeights, layer: int,
                     num_experts: int, top_k: int, ffn: int, tiles: MoeTiles, log2p: int, pdl: PdlPolicy) -> None:
    # Launches 2 and 3, or both in one (MoeTiles.one_launch), under the weight
    # launches' policy; the combine launch of MoeTiles.gate_up_apart under the
    # small launches' (kernels/moe_combine.run_combine).
    weights_pdl = pdl.moe_weights()
    if tiles.one_launch:
        run_gate_up_down(workspace, topk_weights, weights, layer, num_experts, top_k, ffn, tiles, log2p, weights_pdl)
    else:
        run_gate_up(workspace, weights, layer, num_experts, top_k, ffn, tiles, log2p, weights_pdl, combine_pdl=pdl)
        run_down(workspace, topk_weights, weights, layer, num_experts, top_k, ffn, tiles, log2p, weights_pdl)


def _layer_setup(t: int, top_k: int, hidden: int, weights: PagedWeights, layer: int, num_experts: int, ffn: int,
                 device: torch.device, tiles: MoeTiles | None, workspace: MoeWorkspace | None,
                 counters: ArrivalCounters | None, tuning: MoeTuning | None,
                 distinct_ids: bool) -> tuple[MoeWorkspace, MoeTiles, int, torch.Tensor]:
    """Checks one layer's sizes; (workspace, tiles, log2 of the page size, the
    active experts' slot cost: the down blocks' resident field counts, read
    at run time). Tiles chosen here take gate_up_apart only with distinct_ids."""
    if hidden % GROUP or ffn % GROUP:
        raise ValueError(f"hidden and ffn must be multiples of {GROUP}")
    if layer < 0 or num_experts <= 0:
        raise ValueError("layer must be >= 0 and num_experts > 0")
    log2p = check_weights(weights, hidden, ffn, (layer + 1) * num_experts * PROJS_PER_EXPERT)
    if device != weights.storage.device:
        raise ValueError("x and the weights must be on one device")
    if tiles is None:
        sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else DEFAULT_SMS)
        tiles = choose_tiles(t, top_k, num_experts, hidden, ffn, sms, use_asm=device.type == "cuda", tuning=tuning)
        if not distinct_ids:
            tiles = replace(tiles, gate_up_apart=False)
    if ffn % tiles.block_n_up:
        raise ValueError(f"block_n_up {tiles.block_n_up} must divide ffn {ffn}")
    if workspace is None:
        workspace = alloc_workspace(t, top_k, hidden, ffn, num_experts, tiles, device, counters)
    elif workspace.h.shape != (t * top_k, ffn) or workspace.hsum.shape[1] != ffn // tiles.h_sum_rows:
        raise ValueError("workspace does not match these sizes and tiles")
    first = layer * num_experts * PROJS_PER_EXPERT
    down_fields = weights.block_fields[first + PROJ_DOWN: first + num_experts * PROJS_PER_EXPERT: PROJS_PER_EXPERT]
    return workspace, tiles, log2p, down_fields


# -- plain-torch reference ----------------------------------------------------
def read_block(weights: PagedWeights, block: int, n: int, k: int) -> list[torch.Tensor]:
    """The fields' byte strings of one block, gathered from arena pages
    (ValueError for a block read from host pages: WeightStore.read_view reads those)."""
    nf = int(weights.block_fields[block])
    out = []
    for f in range(nf):
        nbytes = field_bytes(f, n, k)
        pages = weights.page_table[block, f, : pages_for(nbytes, weights.storage.shape[1])]
        if bool(((pages < 0) | (pages >= weights.storage.shape[0])).any()):
            raise ValueError(f"block {block} is read from host pages, not the arena")
        out.append(weights.storage[pages].reshape(-1)[:nbytes])
    return out


def dequantized_block(weights: PagedWeights, block: int, n: int, k: int) -> torch.Tensor | None:
    """fp32 [n, k] weights of the block's current view, None when absent (0 fields)."""
    fields = read_block(weights, block, n, k)
    return dequantize_view(fields, len(fields), n, k) if fields else None


def moe_mixed_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                        weights: PagedWeights, layer: int, num_experts: int,
                        ffn: int) -> torch.Tensor:
    """fp32 [T, H]: the same layer in fp32 from the dequantized current views."""
    t, hidden = x.shape
    out = torch.zeros(t, hidden, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in range(num_experts):
        hit = (topk_ids == e).nonzero()
        if hit.numel() == 0:
            continue
        blk = (layer * num_experts + e) * PROJS_PER_EXPERT
        w1 = dequantized_block(weights, blk + PROJ_GATE, ffn, hidden)
        w3 = dequantized_block(weights, blk + PROJ_UP, ffn, hidden)
        w2 = dequantized_block(weights, blk + PROJ_DOWN, hidden, ffn)
        if w1 is None or w3 is None or w2 is None:
            continue
        tok, slot = hit[:, 0], hit[:, 1]
        xe = xf[tok]
        h = torch.nn.functional.silu(xe @ w1.T) * (xe @ w3.T)
        out.index_add_(0, tok, (h @ w2.T) * topk_weights[tok, slot].float()[:, None])
    return out
