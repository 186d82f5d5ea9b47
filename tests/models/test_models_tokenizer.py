"""pw-moe-tiny's tokenizer: special tokens, chat template, lossless byte-level round trip."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.sandbox
import pytest
from tokenizers import Tokenizer

from models.train.tokenizer_spec import (
    BOS_ID, CHAT_TEMPLATE, EOS_ID, PAD_ID, SPECIAL_TOKENS, VOCAB_SIZE, tokenizer_config,
)
from models.train.train_tokenizer import build_tokenizer

MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
SAMPLES = [
    "def f(x):\n    return {'a': [1, 2]}  # comment\n",
    "#include <stdint.h>\nstatic inline int32_t max(int32_t a, int32_t b) { return a > b ? a : b; }\n",
    "The :mod:`json` module -- see :func:`json.dumps`.\n",
    "Größe der Datei »ändern«; Übersicht\ttab  und   Leerzeichen\n",
    "emoji 🙂 and \x07 control and \u00a0 nbsp",
]


def _render(messages: list[dict], add_generation_prompt: bool) -> str:
    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    env.globals["raise_exception"] = raise_exception
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                 bos_token=SPECIAL_TOKENS[BOS_ID])


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


def test_committed_tokenizer_ids(tok: Tokenizer) -> None:
    assert tok.get_vocab_size() == VOCAB_SIZE
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i
    assert tok.encode("hi").ids[0] == BOS_ID  # post-processor prepends bos
    assert tok.encode("hi", add_special_tokens=False).ids[0] != BOS_ID


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_lossless(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_committed_config_matches_spec() -> None:
    cfg = json.loads((MODEL / "tokenizer_config.json").read_text())
    assert cfg == tokenizer_config()
    assert cfg["bos_token"] == SPECIAL_TOKENS[BOS_ID] and cfg["eos_token"] == SPECIAL_TOKENS[EOS_ID]
    assert cfg["pad_token"] == SPECIAL_TOKENS[PAD_ID]


def test_chat_template_renders_turns(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hallo? \n"},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "More"}]
    text = _render(messages, add_generation_prompt=True)
    assert text == ("<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nHallo?<|end|>\n<|assistant|>\nHi.<|end|>\n"
                    "<|user|>\nMore<|end|>\n<|assistant|>\n")
    assert not _render(messages[:2], add_generation_prompt=False).endswith("<|assistant|>\n")
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[:2] == [BOS_ID, SPECIAL_TOKENS.index("<|system|>")]
    assert ids.count(EOS_ID) == 4 and ids[-2] == SPECIAL_TOKENS.index("<|assistant|>")


def test_chat_template_rejects_unknown_role() -> None:
    with pytest.raises(jinja2.exceptions.TemplateError, match="Unknown role: tool"):
        _render([{"role": "tool", "content": "x"}], add_generation_prompt=False)


def test_transformers_applies_the_template() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(MODEL))
    messages = [{"role": "user", "content": "Was ist ein Zeiger?"}]
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == _render(messages, True)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)


def test_build_tokenizer_fixes_special_ids() -> None:
    batches = iter([[s * 20 for s in SAMPLES]])
    tok = build_tokenizer(batches, vocab_size=400)
    assert [tok.token_to_id(s) for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert tok.get_vocab_size() <= 400
