"""Model quality under the multi-precision experts: KL of next-token distributions.

At 8 bits everywhere the model must stay within KL 1e-3 of the unquantized
model, and KL must grow strictly as uniform bits fall 8 -> 6 -> 4 -> 3 -> 2.
Run on a small random Mixtral (transformers) and, when it has been trained,
on the project's default model.
"""

from __future__ import annotations

import inspect
import json
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from dataplane.memory.arena import Arena
from dataplane.weights.layout import VIEW_BITS
from dataplane.weights.transform import quantize_experts

KL_AT_8_BITS = 1e-3
# Larger than transformers' default 0.02: at 0.02 a random model's KL is
# ~2e-6 at 8 bits and ~5e-4 at 2 bits, so the 1e-3 bar would not discriminate.
RANDOM_INIT_STD = 0.05
SEQ_LEN = 384
PAGE_BYTES = 4096
ARENA_PAGES = 8192
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "pw-moe-tiny"
TEST_FILE_MIN_BYTES = 4096  # long enough for SEQ_LEN tokens


def _held_out_text() -> str:
    # Text with real structure (prose and code) that no model here was trained on.
    return textwrap.dedent(inspect.getsource(textwrap))


@torch.no_grad()
def _test_split_text() -> str:
    """A standard-library file from the default model's held-out python test split."""
    manifest = json.loads((REPO_ROOT / "models" / "corpus" / "manifest.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for rel in manifest["domains"]["python"]["splits"]["test"]["paths"]:
        path = stdlib / rel
        if path.exists() and path.stat().st_size > TEST_FILE_MIN_BYTES:
            return path.read_text(errors="replace")
    pytest.fail("no file of the python test split exists in this interpreter's standard library")


@torch.no_grad()  # evaluation only: no autograd graph kept per forward
def _kl_by_bits(model: torch.nn.Module, ids: torch.Tensor) -> dict[int, float]:
    """Mean KL(unquantized || quantized) of next-token distributions at each uniform bitwidth."""
    ref = model(ids).logits.float().log_softmax(-1)  # [1, T, V]
    store = quantize_experts(model, Arena(ARENA_PAGES, PAGE_BYTES), progress=False)
    out: dict[int, float] = {}
    for bits in sorted(VIEW_BITS, reverse=True):
        for b in range(store.num_blocks):
            store.demote(b, bits)
        logp = model(ids).logits.float().log_softmax(-1)
        out[bits] = float((ref.exp() * (ref - logp)).sum(-1).mean())
    return out


def _assert_quality(kl: dict[int, float]) -> None:
    assert kl[8] < KL_AT_8_BITS, kl
    ladder = [kl[b] for b in sorted(VIEW_BITS, reverse=True)]
    assert all(a < b for a, b in zip(ladder, ladder[1:])), f"KL not monotone as bits fall: {kl}"


def test_random_mixtral_quality_ladder() -> None:
    cfg = MixtralConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=SEQ_LEN,
        initializer_range=RANDOM_INIT_STD,
    )
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).eval()
    ids = torch.tensor(list(_held_out_text().encode()[:SEQ_LEN]))[None]  # byte-level tokens
    kl = _kl_by_bits(model, ids)
    _assert_quality(kl)
    assert kl[2] > 10 * kl[8]  # degradation is visible, not noise


def test_default_model_quality_ladder() -> None:
    if not any(DEFAULT_MODEL.glob("*.safetensors")):
        pytest.skip(f"the default model has not been trained into {DEFAULT_MODEL}")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    model = MixtralForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()
    ids = torch.tensor(tokenizer.encode(_test_split_text()).ids[:SEQ_LEN])[None]
    _assert_quality(_kl_by_bits(model, ids))
