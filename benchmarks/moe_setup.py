"""Benchmark scaffolding: paged expert stores at real model shapes.

Every (layer, expert, projection) block holds all five fields in shuffled arena
pages (the content is one random matrix per projection, packed by the
quant_pack kernel); a bitwidth configuration is then just a block_fields
table, exactly as a demotion or promotion changes it at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import weight_layout as wl
from kernels.moe_mixed import PROJS_PER_EXPERT, PagedWeights
from kernels.quant_pack import quant_pack


@dataclass(frozen=True)
class MoeShape:
    name: str
    hidden: int
    ffn: int
    experts: int
    top_k: int


MIXTRAL = MoeShape("mixtral-8x7b", 4096, 14336, 8, 2)
QWEN = MoeShape("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4)  # routed experts only


def block_shape(shape: MoeShape, proj: int) -> tuple[int, int]:
    return (shape.ffn, shape.hidden) if proj < 2 else (shape.hidden, shape.ffn)


def block_bytes(shape: MoeShape, proj: int, num_fields: int) -> int:
    """Bytes a kernel must read for one block at this view: codes + the view's scales."""
    n, k = block_shape(shape, proj)
    codes = sum(wl.field_code_bytes(f, n, k) for f in range(num_fields))
    return codes + n * (k // wl.GROUP) * wl.SCALE_BYTES_PER_GROUP


def build_store(shape: MoeShape, layers: int, page_bytes: int, device: str,
                seed: int = 0) -> PagedWeights:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    fields = []
    for proj in range(PROJS_PER_EXPERT):
        n, k = block_shape(shape, proj)
        w = (torch.randn(n, k, generator=gen) * (0.5 / k**0.5)).to(device=device, dtype=torch.bfloat16)
        fields.append(quant_pack(w))
    n_blocks = layers * shape.experts * PROJS_PER_EXPERT
    pages_of = [[wl.pages_for(f.numel(), page_bytes) for f in fs] for fs in fields]
    per_block = [sum(p) for p in pages_of]
    total = layers * shape.experts * sum(per_block)
    storage = torch.empty(total, page_bytes, dtype=torch.uint8, device=device)
    order = torch.randperm(total, generator=gen)
    table = torch.full((n_blocks, wl.NUM_FIELDS, max(max(p) for p in pages_of)), -1, dtype=torch.int64)
    cursor = 0
    for proj in range(PROJS_PER_EXPERT):
        blocks = torch.arange(proj, n_blocks, PROJS_PER_EXPERT)
        for f in range(wl.NUM_FIELDS):
            npg = pages_of[proj][f]
            ids = order[cursor : cursor + npg * len(blocks)].reshape(len(blocks), npg)
            cursor += npg * len(blocks)
            table[blocks, f, :npg] = ids
            padded = torch.zeros(npg * page_bytes, dtype=torch.uint8, device=device)
            padded[: fields[proj][f].numel()] = fields[proj][f]
            src = padded.view(1, npg, page_bytes).expand(len(blocks), npg, page_bytes)
            storage[ids.reshape(-1).to(device)] = src.reshape(-1, page_bytes)
    bf = torch.full((n_blocks,), wl.NUM_FIELDS, dtype=torch.int32, device=device)
    return PagedWeights(storage, table.to(device), bf)


def mixed_views(bits: str) -> tuple[int, int] | None:
    """(low, high) bits of a mixed configuration name: 'mixed' = 'mixed2-6',
    'mixedA-B' for two views A < B; None for a uniform name."""
    if bits == "mixed":
        return 2, 6
    if not bits.startswith("mixed"):
        return None
    try:
        lo, hi = (int(v) for v in bits[len("mixed"):].split("-"))
    except ValueError:
        raise ValueError(f"mixed configuration must be 'mixedA-B', got {bits!r}") from None
    if lo not in wl.VIEW_BITS or hi not in wl.VIEW_BITS or lo >= hi:
        raise ValueError(f"mixed views must be two of {wl.VIEW_BITS}, low first; got {bits!r}")
    return lo, hi


def projection_views(bits: str) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """Views (gate, up, down) of even and of odd experts for a configuration
    name: 'mixedA-B' = ((A, B, A), (B, A, B)); 'views-G.U.D-G.U.D' names both
    triples (e.g. 'views-2.6.4-6.2.4': gate and up mixed, every down block at
    4 bits); None for a uniform name."""
    if bits.startswith("views-"):
        try:
            even, odd = (tuple(int(v) for v in part.split(".")) for part in bits[len("views-"):].split("-"))
        except ValueError:
            raise ValueError(f"configuration must be 'views-G.U.D-G.U.D', got {bits!r}") from None
        if len(even) != PROJS_PER_EXPERT or len(odd) != PROJS_PER_EXPERT or \
                any(v not in wl.VIEW_BITS for v in even + odd):
            raise ValueError(f"views-G.U.D-G.U.D takes six views of {wl.VIEW_BITS}; got {bits!r}")
        return even, odd
    views = mixed_views(bits)
    if views is None:
        return None
    lo, hi = views
    return (lo, hi, lo), (hi, lo, hi)


def two_views(bits: str) -> tuple[int, int] | None:
    """(low, high) for a configuration with half its blocks at each of two
    views, whatever their places: 'mixedA-B' (inside each expert) and
    whole-expert mixes such as 'views-6.6.6-2.2.2' (the planner's kind of
    state); None for a uniform name or any other mix."""
    views = projection_views(bits)
    if views is None:
        return None
    six = sorted(views[0] + views[1])
    lo, hi = six[0], six[-1]
    if lo == hi or six != [lo] * PROJS_PER_EXPERT + [hi] * PROJS_PER_EXPERT:
        return None
    return lo, hi


def fields_config(shape: MoeShape, layers: int, bits: str) -> torch.Tensor:
    """block_fields for a configuration: '8', '4', ... uniform, or mixed
    (projection_views).

    mixedA-B ('mixed' = 'mixed2-6'): even experts (gate, up, down) at
    (A, B, A) bits, odd at (B, A, B): every pair of experts averages (A + B) / 2
    bits per block (for 2-6 the bytes of uniform 4-bit), and gate and up of one
    expert differ.
    """
    n_blocks = layers * shape.experts * PROJS_PER_EXPERT
    views = projection_views(bits)
    if views is None:
        return torch.full((n_blocks,), wl.fields_for_bits(int(bits)), dtype=torch.int32)
    out = torch.empty(n_blocks, dtype=torch.int32)
    for b in range(n_blocks):
        expert = (b // PROJS_PER_EXPERT) % shape.experts
        out[b] = wl.fields_for_bits(views[expert % 2][b % PROJS_PER_EXPERT])
    return out


ROUTINGS = ("roundrobin", "random")


def routing(shape: MoeShape, batch: int, device: str, seed: int = 0, mode: str = "roundrobin"):
    """Top-k routing, distinct experts per token. roundrobin: token t takes
    experts t*k .. t*k+k-1 mod E (touches min(E, B*k) experts, equal loads);
    roundrobin:N the same over the first N experts only (N in [k, E]: a
    launch sized for min(E, B*k) expert slots with fewer active);
    random: k experts drawn uniformly per token (seeded), so loads vary as
    with a router (at B=64 on Mixtral some experts get more than 16 tokens)."""
    base, _, used = mode.partition(":")
    if base not in ROUTINGS or (used and base != "roundrobin"):
        raise ValueError(f"routing must be one of {ROUTINGS} or roundrobin:N, got {mode!r}")
    experts = shape.experts
    if used:
        if not used.isdigit() or not shape.top_k <= int(used) <= shape.experts:
            raise ValueError(f"roundrobin:N needs {shape.top_k} <= N <= {shape.experts}, got {mode!r}")
        experts = int(used)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if base == "random":
        ids = torch.rand(batch, shape.experts, generator=gen).topk(shape.top_k, dim=1).indices.to(torch.int32)
    else:
        # token t's k slots are consecutive mod N (distinct while k <= N)
        flat = (torch.arange(batch)[:, None] * shape.top_k + torch.arange(shape.top_k)[None, :]) % experts
        ids = flat.to(torch.int32)
    w = torch.rand(batch, shape.top_k, generator=gen)
    w = w / w.sum(-1, keepdim=True)
    return ids.to(device), w.to(device)


def touched_bytes(shape: MoeShape, ids: torch.Tensor, fields: torch.Tensor, layer: int) -> int:
    """Weight bytes one layer must read: distinct experts x their blocks at their views."""
    total = 0
    for e in sorted(set(ids.reshape(-1).tolist())):
        for proj in range(PROJS_PER_EXPERT):
            nf = int(fields[(layer * shape.experts + e) * PROJS_PER_EXPERT + proj])
            total += block_bytes(shape, proj, nf)
    return total
