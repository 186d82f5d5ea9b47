"""Synthetic models: real shapes, random weights, built in device memory.

For performance work at real sizes without checkpoint files. Weights are drawn
on the target device one parameter (experts: one expert) at a time, so the
host never holds a copy and the device never holds two.

With paged experts the dense expert stacks are never materialised: the model
is built with its experts on the ``meta`` device and ``synthetic_expert_blocks``
draws and encodes one expert block at a time (Mixtral-8x7B's 93 GB of bf16
experts would not fit beside their own 8-bit pages).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

import torch
from torch import nn

from dataplane.models.mixtral import MixtralSpec
from dataplane.models.registry import build_model

INIT_STD = 0.02  # the initializer_range of Hugging Face configs

# Read-only: presets are constants.
PRESETS: MappingProxyType[str, MixtralSpec] = MappingProxyType({
    "mixtral-8x7b": MixtralSpec(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        num_experts=8,
        top_k=2,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "mixtral-tiny": MixtralSpec(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        num_experts=8,
        top_k=2,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_ids=(1,),
    ),
})


def synthetic_spec(preset: str) -> MixtralSpec:
    """The spec of a named preset; ValueError listing the presets otherwise."""
    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[preset]


@torch.no_grad()
def init_random_(model: nn.Module, seed: int) -> None:
    """Fills every parameter in place: norms with 1, the rest ~ N(0, INIT_STD).

    Stacked expert tensors ([E, ...]) are filled one expert at a time.
    """
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if param.is_meta:  # not materialised (paged experts are drawn elsewhere)
            continue
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        gen = generators.get(param.device)
        if gen is None:
            gen = generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        chunks = param.unbind(0) if param.dim() == 3 else (param,)
        for chunk in chunks:
            chunk.normal_(0.0, INIT_STD, generator=gen)


def build_synthetic(
    spec: MixtralSpec | str, device: torch.device, dtype: torch.dtype, seed: int = 0, *, dense_experts: bool = True
) -> tuple[MixtralSpec, nn.Module]:
    """A model of ``spec`` (or a preset name) with random weights on ``device``.

    dense_experts=False leaves the expert stacks on ``meta`` (no memory): the
    caller replaces them, e.g. with paged experts fed by ``synthetic_expert_blocks``.
    """
    if isinstance(spec, str):
        spec = synthetic_spec(spec)
    model = build_model(spec, device, dtype, expert_device=None if dense_experts else torch.device("meta"))
    init_random_(model, seed)
    return spec, model.eval()


@torch.no_grad()
def synthetic_expert_blocks(spec: MixtralSpec, device: torch.device, seed: int) -> Iterator[torch.Tensor]:
    """Random expert matrices in block-index order ((layer * E + expert) * 3 + proj).

    Yields gate [F, H], up [F, H], down [H, F] of each expert (~ N(0, INIT_STD),
    bf16 on ``device``), one at a time: the consumer encodes each before the next.
    """
    gen = torch.Generator(device=device).manual_seed(seed + 1)  # not the dense parameters' stream
    f, h = spec.intermediate_size, spec.hidden_size
    for _ in range(spec.num_layers * spec.num_experts):
        for shape in ((f, h), (f, h), (h, f)):
            w = torch.empty(shape, device=device, dtype=torch.bfloat16)  # [N, K]
            yield w.normal_(0.0, INIT_STD, generator=gen)
