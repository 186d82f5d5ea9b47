"""Synthetic models: real shapes, random weights, built in device memory.

For performance work at real sizes without checkpoint files. Weights are drawn
on the target device one parameter (experts: one expert) at a time, so the
host never holds a copy and the device never holds two.
"""

from __future__ import annotations

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
    spec: MixtralSpec | str, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[MixtralSpec, nn.Module]:
    """A model of ``spec`` (or a preset name) with random weights on ``device``."""
    if isinstance(spec, str):
        spec = synthetic_spec(spec)
    model = build_model(spec, device, dtype)
    init_random_(model, seed)
    return spec, model.eval()
