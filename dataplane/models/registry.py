"""Which model families the dataplane serves, keyed by config.json model_type."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dataplane.models.mixtral import FAMILY as MIXTRAL
from dataplane.models.mixtral import MixtralForCausalLM, MixtralSpec

SUPPORTED_FAMILIES = (MIXTRAL,)


def spec_from_hf_config(cfg: dict[str, Any]) -> MixtralSpec:
    """The family's spec for a Hugging Face config; ValueError when unsupported."""
    model_type = cfg.get("model_type")
    if model_type == MIXTRAL:
        return MixtralSpec.from_hf_config(cfg)
    raise ValueError(
        f"unsupported model family {model_type!r}; supported: {', '.join(SUPPORTED_FAMILIES)}"
    )


def build_model(
    spec: MixtralSpec, device: torch.device, dtype: torch.dtype, expert_device: torch.device | None = None
) -> nn.Module:
    """An uninitialised model of the spec's family on ``device`` (dense experts on ``expert_device``)."""
    if spec.family == MIXTRAL:
        return MixtralForCausalLM(spec, device, dtype, expert_device)
    raise ValueError(f"unsupported model family {spec.family!r}")
