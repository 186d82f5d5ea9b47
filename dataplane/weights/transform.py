"""quantize_experts: swap every dense experts module of a model for PagedExperts.

Recognised expert modules (found in ``named_modules`` order = layer order):
* DenseExperts-style: parameters w1 [E, F, H] (gate), w3 [E, F, H] (up), w2 [E, H, F] (down);
* Hugging Face MixtralExperts-style: gate_up_proj [E, 2F, H] (gate rows first), down_proj [E, H, F].
All blocks go into one WeightStore with block index ((layer * E + expert) * 3 + proj).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from dataplane.memory.arena import Arena
from dataplane.weights.block_encoder import encode_block
from dataplane.weights.codec import DEFAULT_SCALE_FIT, BlockBytes, ScaleFit
from dataplane.weights.copy_engine import CopyEngine
from dataplane.weights.layout import VIEW_BITS
from dataplane.weights.paged_experts import PagedExperts
from dataplane.weights.store import WeightStore
from kernels.arrival_counters import ArrivalCounters
from kernels.moe_tuning import MoeTuning


@dataclass(frozen=True)
class _ExpertLayer:
    name: str  # module path in the model
    gate: torch.Tensor  # [E, F, H]
    up: torch.Tensor  # [E, F, H]
    down: torch.Tensor  # [E, H, F]


def _expert_weights(name: str, module: nn.Module) -> _ExpertLayer | None:
    params = dict(module.named_parameters(recurse=False))
    if {"w1", "w2", "w3"} <= params.keys():
        gate, up, down = params["w1"], params["w3"], params["w2"]
    elif {"gate_up_proj", "down_proj"} <= params.keys() and params["gate_up_proj"].dim() == 3:
        gate, up = params["gate_up_proj"].chunk(2, dim=1)
        down = params["down_proj"]
    else:
        return None
    if not (gate.dim() == up.dim() == down.dim() == 3):
        return None
    e, f, h = gate.shape
    if up.shape != (e, f, h) or down.shape != (e, h, f):
        raise ValueError(
            f"{name}: expert shapes gate {tuple(gate.shape)}, up {tuple(up.shape)}, down {tuple(down.shape)} "
            "do not match [E, F, H] / [E, F, H] / [E, H, F]"
        )
    return _ExpertLayer(name, gate.detach(), up.detach(), down.detach())


def find_expert_layers(model: nn.Module) -> list[_ExpertLayer]:
    """Expert modules of ``model`` in layer order, with their weights as [E, ., .] stacks."""
    found = [_expert_weights(name, m) for name, m in model.named_modules()]
    return [layer for layer in found if layer is not None]


def encode_layers(
    layers: Sequence[_ExpertLayer], scale_fit: ScaleFit = DEFAULT_SCALE_FIT, progress: bool = True
) -> Iterator[BlockBytes]:
    """Encodes every block of ``layers`` lazily, in block-index order (expert-major, then gate, up, down),
    each by block_encoder.encode_block (the Triton packer for GPU tensors)."""
    mats = [
        m for layer in layers for e in range(layer.gate.shape[0]) for m in (layer.gate[e], layer.up[e], layer.down[e])
    ]
    for m in tqdm(mats, desc="quantizing expert blocks", unit="block", disable=not progress):
        yield encode_block(m, scale_fit)


def encode_matrices(
    matrices: Iterable[torch.Tensor], total: int, scale_fit: ScaleFit = DEFAULT_SCALE_FIT, progress: bool = True
) -> Iterator[BlockBytes]:
    """Encodes block matrices as they arrive (``total`` of them, for the progress bar), as encode_layers."""
    for m in tqdm(matrices, total=total, desc="quantizing expert blocks", unit="block", disable=not progress):
        yield encode_block(m, scale_fit)


def quantize_experts(
    model: nn.Module,
    arena: Arena,
    *,
    matrices: Iterable[torch.Tensor] | None = None,
    initial_bits: int | Sequence[int] = VIEW_BITS[-1],
    scale_fit: ScaleFit = DEFAULT_SCALE_FIT,
    copy_engine: CopyEngine | None = None,
    cache_decoded: bool | None = None,
    accumulator_out: bool = False,
    fused_entry: bool = True,
    moe_tuning: MoeTuning | None = None,
    progress: bool = True,
) -> WeightStore:
    """Replaces every expert module of ``model`` in place with PagedExperts; returns their store.

    The store's pages come from ``arena``; raises OutOfPages (model untouched)
    when ``initial_bits`` do not fit. ``matrices``: the blocks' dense matrices
    in block-index order, used instead of the expert modules' weights (which
    may then live on ``meta``); their shapes are checked against the modules.
    accumulator_out: see PagedExperts (only for models whose norms round the
    experts' float32 output). fused_entry, moe_tuning: see PagedExperts. The
    layers share one set of arrival counters.
    """
    layers = find_expert_layers(model)
    if not layers:
        raise ValueError("no expert modules (w1/w2/w3 or gate_up_proj/down_proj) found in the model")
    num_experts, ffn, hidden = layers[0].gate.shape
    for layer in layers:
        if not layer.name:
            raise ValueError("the model itself is an experts module; wrap it in a parent module")
        if layer.gate.shape != (num_experts, ffn, hidden):
            raise ValueError(f"{layer.name}: expert shape {tuple(layer.gate.shape)} differs from the first layer's")
    # The store copies each block to its host pages as it is encoded (host peak: one block extra).
    if matrices is None:
        blocks = encode_layers(layers, scale_fit, progress)
    else:
        blocks = encode_matrices(matrices, len(layers) * num_experts * 3, scale_fit, progress)
    store = WeightStore(arena, blocks, initial_bits=initial_bits, copy_engine=copy_engine)
    counters = ArrivalCounters()
    for i, layer in enumerate(layers):
        parent_name, _, attr = layer.name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, PagedExperts(store, i, num_experts, hidden, ffn, cache_decoded=cache_decoded,
                                           counters=counters, accumulator_out=accumulator_out,
                                           fused_entry=fused_entry, moe_tuning=moe_tuning))
    return store
