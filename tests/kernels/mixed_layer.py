"""The small mixed-bits MoE layer several kernel tests share: its shapes, the
resident field count of each block (every view, expert 4 host-only), the
relative error they compare with, the two-expert layer over several token
tiles, and the eager-then-graph-replay check of a larger layer."""

from __future__ import annotations

import torch

from kernels.moe_mixed import alloc_workspace, fused_moe_mixed, moe_mixed_reference
from kernels.moe_paged import PROJ_DOWN
from tests.kernels.paged_store import random_moe

H, F, E = 256, 384, 5
PAGE = 8192  # 64-row tiles of the down blocks (6 KiB) straddle pages
FIELDS = [5, 1, 3, 2, 4, 3, 1, 5, 2, 4, 4, 2, 3, 5, 1]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def mixed_fields(layer: int, e: int, proj: int) -> int:
    """Resident fields of block (layer, expert e, projection proj)."""
    if e == 4:
        return 0  # host-only expert
    return FIELDS[(e * 3 + proj + layer) % len(FIELDS)]


def check_two_expert_layer(device, t: int, tiles) -> None:
    """t tokens on two experts (expert 1 holds every token; where t > 32,
    expert 0 holds t - 10 of them and expert 3 the other 10: both token
    classes), one slot routed to a host-only expert (2), one ignored (-1):
    the fused layer with these tiles against the plain-torch reference."""
    weights = random_moe(1, E, H, F, lambda l, e, p: 0 if e == 2 else [2, 5, 3][p], PAGE, device, seed=5)
    torch.manual_seed(6)
    x = torch.randn(t, H).to(torch.float16)
    ids = torch.tensor([[1, 3]] * t)
    if t > 32:
        ids[: t - 10, 1] = 0
    ids[0, 1] = 2
    ids[1, 0] = -1
    tw = torch.rand(t, 2)
    out = fused_moe_mixed(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F, tiles)
    ref = moe_mixed_reference(x.to(device), ids.to(device), tw.to(device), weights, 0, E, F)
    assert rel_err(out, ref) < 3e-3


def check_eager_and_replay(device, tiles, ids, new_ids, seed, demote_first_block=False, workspace=None,
                           ffn=1408, demote_first_down=False):
    """The layer (1024 x ffn, 8 experts, mixed bits) against the fp32
    reference eagerly, then (on CUDA) replayed from a graph after the routing
    changes in place to new_ids and, optionally, block 0 (demote_first_block)
    or expert 0's down block (demote_first_down) drops to one field: the
    graph reads the tables, so neither needs a re-capture."""
    hidden, experts = 1024, 8
    weights = random_moe(1, experts, hidden, ffn, lambda l, e, p: 1 + (e * 3 + p) % 5, 1 << 16, device)
    torch.manual_seed(seed)
    t, k = ids.shape
    x = torch.randn(t, hidden, device=device, dtype=torch.bfloat16)
    ids = ids.to(device=device, dtype=torch.int32)
    tw = torch.rand(t, k, device=device)
    ws = workspace or alloc_workspace(t, k, hidden, ffn, experts, tiles, device)
    out = fused_moe_mixed(x, ids, tw, weights, 0, experts, ffn, tiles, ws).clone()
    assert rel_err(out, moe_mixed_reference(x, ids, tw, weights, 0, experts, ffn)) < 3e-3
    if device != "cuda":
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_mixed(x, ids, tw, weights, 0, experts, ffn, tiles, ws)
    ws.prep.out.fill_(float("nan"))
    ids.copy_(new_ids.to(device=device, dtype=torch.int32))
    if demote_first_block:
        weights.block_fields[0] = 1
    if demote_first_down:
        weights.block_fields[PROJ_DOWN] = 1  # expert 0's down block: 3 fields -> 1, another h plane
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(ws.prep.out, moe_mixed_reference(x, ids, tw, weights, 0, experts, ffn)) < 3e-3
