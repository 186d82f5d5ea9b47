"""tools/make_random_checkpoint.py writes a checkpoint transformers accepts."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import MixtralForCausalLM

from dataplane.checkpoint import Checkpoint
from dataplane.models.registry import build_model
from dataplane.models.synthetic import PRESETS, build_synthetic
from tools.make_random_checkpoint import SPECIAL_TOKENS, make_random_checkpoint, train_tokenizer


def test_layout_tokenizer_and_template(random_ckpt):
    index = json.loads((random_ckpt / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) == 2 and all((random_ckpt / s).is_file() for s in shards)
    tokenizer = Tokenizer.from_file(str(random_ckpt / "tokenizer.json"))
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = "<|user|>\nReturn the list.<|end|>"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert ids[-1] == tokenizer.token_to_id("<|end|>")
    info = Checkpoint(random_ckpt).tokenizer_info()
    assert info.eos_token == "<|end|>" and info.eos_token_ids == (tokenizer.token_to_id("<|end|>"),)
    assert "<|assistant|>" in info.chat_template


def test_tokenizer_training_is_deterministic(random_ckpt):
    written = Tokenizer.from_file(str(random_ckpt / "tokenizer.json"))
    assert train_tokenizer(512).to_str() == written.to_str()


def test_transformers_loads_it_and_agrees_with_the_dataplane(random_ckpt):
    hf = MixtralForCausalLM.from_pretrained(random_ckpt).eval()
    ckpt = Checkpoint(random_ckpt)
    ours = build_model(ckpt.spec, torch.device("cpu"), torch.float32)
    ours.load_weights(ckpt.iter_tensors(progress=False))
    names = dict(ours.named_parameters())
    expert = names["model.layers.1.block_sparse_moe.experts.w2"][3]
    hf_down = hf.model.layers[1].mlp.experts.down_proj[3]
    torch.testing.assert_close(expert, hf_down)
    torch.testing.assert_close(names["lm_head.weight"], hf.lm_head.weight)


def test_sizes_must_be_multiples_of_the_group(tmp_path):
    with pytest.raises(ValueError, match="multiple of 128"):
        make_random_checkpoint(tmp_path / "bad", hidden_size=96)


def test_synthetic_presets_have_real_shapes():
    spec = PRESETS["mixtral-8x7b"]
    meta = build_model(spec, torch.device("meta"), torch.bfloat16)
    params = sum(p.numel() for p in meta.parameters())
    assert 46.6e9 < params < 46.8e9  # Mixtral-8x7B: 46.7 B parameters
    _, tiny = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=3)
    w1 = tiny.model.layers[0].block_sparse_moe.experts.w1
    assert torch.isfinite(w1).all() and 0.015 < w1.std().item() < 0.025
    assert torch.all(tiny.model.norm.weight == 1)
    _, again = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=3)
    assert torch.equal(again.model.layers[0].block_sparse_moe.experts.w1, w1)
    with pytest.raises(ValueError, match="unknown synthetic preset"):
        build_synthetic("gpt-9", torch.device("cpu"), torch.float32)
