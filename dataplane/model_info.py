"""What the dataplane tells others about its model (gateway and controlplane)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """The served model's identity, limits, tokenizer and MoE shape."""

    name: str
    family: str
    model_path: str  # "" in synthetic mode
    context_length: int  # max prompt + completion tokens of one sequence
    vocab_size: int
    tokenizer_json: str  # "" when the model has no tokenizer (synthetic mode)
    chat_template: str
    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_experts: int
    top_k: int
    hidden_size: int
    ffn_size: int  # per expert
