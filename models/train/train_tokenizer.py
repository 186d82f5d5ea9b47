"""Trains pw-moe-tiny's byte-level BPE tokenizer on the corpus' TRAIN splits only.

    .venv/bin/python -m models.train.train_tokenizer --corpus data/corpus --out models/pw-moe-tiny

Writes ``tokenizer.json`` (BPE, byte-level pre-tokenizer and decoder, a
post-processor that prepends ``<|bos|>``) and ``tokenizer_config.json`` (special
tokens and the chat template; see tokenizer_spec.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from models.corpus.build_corpus import read_split
from models.train.tokenizer_spec import BOS, BOS_ID, SPECIAL_TOKENS, VOCAB_SIZE, tokenizer_config

MIN_PAIR_FREQUENCY = 2
BATCH_DOCS = 256


def _train_texts(corpus: Path, domains: list[str]) -> Iterator[list[str]]:
    for domain in domains:
        docs = read_split(corpus, domain, "train")
        for start in range(0, len(docs), BATCH_DOCS):
            yield [d["text"] for d in docs[start:start + BATCH_DOCS]]


def build_tokenizer(batches: Iterator[list[str]], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (special tokens included) trained on ``batches``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_PAIR_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(batches, trainer=trainer)
    for i, special in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(special) != i:
            raise RuntimeError(f"special token {special} got id {tok.token_to_id(special)}, expected {i}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tok


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--manifest", type=Path, default=Path("models/corpus/manifest.json"))
    parser.add_argument("--out", type=Path, default=Path("models/pw-moe-tiny"))
    args = parser.parse_args(argv)
    domains = list(json.loads(args.manifest.read_text())["domains"])
    tok = build_tokenizer(_train_texts(args.corpus, domains))
    save(tok, args.out)
    print(f"[tokenizer] vocab {tok.get_vocab_size()} -> {args.out}")


if __name__ == "__main__":
    main()
