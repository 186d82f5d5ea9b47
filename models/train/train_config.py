"""Typed training configuration of pw-moe-tiny, read once from a JSON file.

The JSON has three parts: ``seed``/``name``/``domains``, ``model`` (Mixtral
architecture fields) and ``train`` (optimisation and schedule). Unknown keys are
errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

QUANT_GROUP = 128  # experts are quantized in groups of 128 along the input dim


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # per expert
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_local_experts: int
    num_experts_per_tok: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    router_aux_loss_coef: float
    initializer_range: float

    def validate(self) -> None:
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % QUANT_GROUP:
                raise ValueError(f"model.{name}={getattr(self, name)} must be a multiple of {QUANT_GROUP}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError("need 0 < num_experts_per_tok <= num_local_experts")

    def parameter_count(self) -> int:
        """Stored parameters (tied head counted once)."""
        h, f, e = self.hidden_size, self.intermediate_size, self.num_local_experts
        attn = h * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attn + e * 3 * h * f + e * h + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head


@dataclass(frozen=True)
class TrainConfig:
    steps: int  # planned optimizer steps (the time guard may lower it, see train.py)
    warmup_steps: int
    batch_sequences: int  # per step, split equally across domains
    seq_len: int
    peak_lr: float
    min_lr_ratio: float  # cosine decays to peak_lr * min_lr_ratio
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    eval_every: int
    eval_max_windows: int | None  # validation windows per domain during training (None: the whole split)
    log_every: int
    max_train_seconds: float  # wall-time budget for the optimisation loop
    calibrate_steps: int  # steps timed before the budget check (must be < warmup_steps)
    save_dtype: str  # "bfloat16" or "float32"
    max_shard_size: str  # save_pretrained shard size (files come back from the GPU machine in <16 MiB pieces)

    def validate(self, n_domains: int) -> None:
        if self.batch_sequences % n_domains:
            raise ValueError(f"train.batch_sequences must be a multiple of the {n_domains} domains")
        if not 0 < self.calibrate_steps < self.warmup_steps < self.steps:
            raise ValueError("need 0 < calibrate_steps < warmup_steps < steps (the time guard may only "
                             "shorten the schedule while it is still warming up)")
        if self.save_dtype not in ("bfloat16", "float32"):
            raise ValueError("train.save_dtype must be bfloat16 or float32")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("train.min_lr_ratio must be in [0, 1]")


@dataclass(frozen=True)
class RunConfig:
    name: str
    seed: int
    domains: tuple[str, ...]
    model: ModelConfig
    train: TrainConfig

    def validate(self) -> None:
        if not self.domains:
            raise ValueError("no domains")
        self.model.validate()
        self.train.validate(len(self.domains))
        if self.train.seq_len > self.model.max_position_embeddings:
            raise ValueError("train.seq_len exceeds model.max_position_embeddings")


def _strict(cls, data: dict, where: str):
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    missing = names - set(data)
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    return cls(**data)


def load_config(path: Path) -> RunConfig:
    data = json.loads(Path(path).read_text())
    top = {k: v for k, v in data.items() if k not in ("model", "train")}
    cfg = _strict(RunConfig, {**top, "domains": tuple(data.get("domains", ())),
                              "model": _strict(ModelConfig, data["model"], "model"),
                              "train": _strict(TrainConfig, data["train"], "train")}, str(path))
    cfg.validate()
    return cfg


def mixtral_config(model: ModelConfig, pad_id: int, bos_id: int, eos_id: int):
    """The transformers MixtralConfig for ``model`` (imported lazily: only the trainer needs it)."""
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads,
        head_dim=model.head_dim,
        num_local_experts=model.num_local_experts,
        num_experts_per_tok=model.num_experts_per_tok,
        max_position_embeddings=model.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
        rms_norm_eps=model.rms_norm_eps,
        tie_word_embeddings=model.tie_word_embeddings,
        router_aux_loss_coef=model.router_aux_loss_coef,
        initializer_range=model.initializer_range,
        sliding_window=None,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
