"""Reads a Hugging Face model folder lazily.

Layout: ``config.json``; weights in ``model.safetensors`` or in shards listed by
``model.safetensors.index.json``; ``tokenizer.json`` and
``tokenizer_config.json`` (chat template, bos/eos tokens); optionally
``generation_config.json`` (more eos ids) and ``chat_template.jinja``.

Tensors are streamed one at a time with safetensors ``safe_open`` (memory
mapped), so a checkpoint is never held in memory twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from dataplane.models.mixtral import MixtralSpec
from dataplane.models.registry import spec_from_hf_config

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class CheckpointError(ValueError):
    """The folder is not a checkpoint the dataplane can load."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What the gateway needs to speak text (see inference.proto ModelInfo)."""

    tokenizer_json: str
    chat_template: str
    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]


class Checkpoint:
    """A validated model folder: its config, spec, weight files and tokenizer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"model folder {self.path} does not exist")
        config_path = self.path / CONFIG_FILE
        if not config_path.is_file():
            raise CheckpointError(f"{self.path} has no {CONFIG_FILE}: not a Hugging Face model folder")
        self.hf_config: dict[str, Any] = json.loads(config_path.read_text())
        try:
            self.spec: MixtralSpec = spec_from_hf_config(self.hf_config)
        except (KeyError, ValueError) as err:
            raise CheckpointError(f"{config_path}: {err}") from err
        self.weight_map = self._read_weight_map()

    def _read_weight_map(self) -> dict[str, str]:
        """Tensor name -> shard file name."""
        index = self.path / WEIGHTS_INDEX
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            missing = sorted({f for f in weight_map.values() if not (self.path / f).is_file()})
            if missing:
                raise CheckpointError(f"{index} names missing shards: {missing}")
            return weight_map
        single = self.path / SINGLE_WEIGHTS
        if single.is_file():
            with safe_open(str(single), framework="pt") as f:
                return {name: SINGLE_WEIGHTS for name in f.keys()}
        raise CheckpointError(f"{self.path} has neither {SINGLE_WEIGHTS} nor {WEIGHTS_INDEX}")

    @property
    def name(self) -> str:
        return self.path.resolve().name

    def iter_tensors(
        self, device: torch.device | str = "cpu", progress: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yields (name, tensor) one at a time, shard by shard, in stored dtype."""
        by_file: dict[str, list[str]] = {}
        for name, file in self.weight_map.items():
            by_file.setdefault(file, []).append(name)
        bar = tqdm(total=len(self.weight_map), desc="loading tensors", unit="tensor", disable=not progress)
        with bar:
            for file in sorted(by_file):
                with safe_open(str(self.path / file), framework="pt", device=str(device)) as f:
                    for name in sorted(by_file[file]):
                        yield name, f.get_tensor(name)
                        bar.update(1)

    def tokenizer_info(self) -> TokenizerInfo:
        """Tokenizer, chat template and end-of-sequence ids of the model."""
        tok_path = self.path / TOKENIZER_FILE
        if not tok_path.is_file():
            raise CheckpointError(f"{self.path} has no {TOKENIZER_FILE} (the gateway needs it)")
        tokenizer_json = tok_path.read_text()
        tok_cfg_path = self.path / TOKENIZER_CONFIG
        tok_cfg: dict[str, Any] = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.is_file() else {}
        bos = _token_text(tok_cfg.get("bos_token"))
        eos = _token_text(tok_cfg.get("eos_token"))
        eos_ids: list[int] = []
        gen_path = self.path / GENERATION_CONFIG
        if gen_path.is_file():
            eos_ids += _as_ids(json.loads(gen_path.read_text()).get("eos_token_id"))
        eos_ids += list(self.spec.eos_token_ids)
        if eos:
            token_id = _token_id(json.loads(tokenizer_json), eos)
            if token_id is not None:
                eos_ids.append(token_id)
        unique = tuple(dict.fromkeys(i for i in eos_ids if 0 <= i < self.spec.vocab_size))
        return TokenizerInfo(
            tokenizer_json=tokenizer_json,
            chat_template=self._chat_template(tok_cfg),
            bos_token=bos,
            eos_token=eos,
            eos_token_ids=unique,
        )

    def _chat_template(self, tok_cfg: dict[str, Any]) -> str:
        template = tok_cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template", "") for t in template}
            template = named.get("default") or next(iter(named.values()), "")
        if template:
            return str(template)
        jinja = self.path / CHAT_TEMPLATE_FILE
        return jinja.read_text() if jinja.is_file() else ""


def _token_text(value: Any) -> str:
    """tokenizer_config stores special tokens as a string or {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _token_id(tokenizer: dict[str, Any], text: str) -> int | None:
    """Id of a token string in a tokenizers JSON (added tokens, then vocab)."""
    for added in tokenizer.get("added_tokens", []):
        if added.get("content") == text:
            return int(added["id"])
    vocab = tokenizer.get("model", {}).get("vocab")
    if isinstance(vocab, dict) and text in vocab:
        return int(vocab[text])
    return None
