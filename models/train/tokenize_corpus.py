"""Tokenizes every split of the corpus into compressed uint16 token streams.

    .venv/bin/python -m models.train.tokenize_corpus --corpus data/corpus --tokenizer models/pw-moe-tiny --out data/tokens

Each document becomes ``<|bos|> tokens <|end|>``; a split is the concatenation
of its documents in corpus order, stored as little-endian uint16 compressed with
xz (``<domain>.<split>.u16.xz``). ``meta.json`` records, per split, documents,
tokens, UTF-8 bytes of the text (for bits per byte) and the sha256 of the raw
stream. The folder is small enough to carry to the GPU machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from models.corpus.build_corpus import SPLITS, read_split
from models.train.tokenizer_spec import BOS_ID, EOS_ID

META_FILE = "meta.json"
ENCODE_BATCH = 512
XZ_PRESET = 6


def stream_path(tokens_dir: Path, domain: str, split: str) -> Path:
    return tokens_dir / f"{domain}.{split}.u16.xz"


def tokenize_documents(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """One uint16 stream [n_tokens] of ``<|bos|> doc <|end|>`` frames."""
    if tok.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise ValueError("vocabulary does not fit uint16")
    pieces = []
    for start in range(0, len(texts), ENCODE_BATCH):
        for enc in tok.encode_batch(texts[start:start + ENCODE_BATCH], add_special_tokens=False):
            pieces.append(np.asarray([BOS_ID, *enc.ids, EOS_ID], dtype=np.uint16))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)


def write_stream(stream: np.ndarray, path: Path) -> str:
    raw = stream.astype("<u2").tobytes()
    path.write_bytes(lzma.compress(raw, preset=XZ_PRESET))
    return hashlib.sha256(raw).hexdigest()


def load_stream(tokens_dir: Path, domain: str, split: str) -> np.ndarray:
    """The token stream [n_tokens] uint16 of one split, checked against meta.json."""
    meta = load_meta(tokens_dir)
    entry = meta["domains"][domain][split]
    raw = lzma.decompress(stream_path(tokens_dir, domain, split).read_bytes())
    if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
        raise ValueError(f"{domain}/{split}: token stream does not match meta.json (stale or corrupt)")
    return np.frombuffer(raw, dtype="<u2").copy()


def load_meta(tokens_dir: Path) -> dict:
    path = tokens_dir / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: run python -m models.train.tokenize_corpus first")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--manifest", type=Path, default=Path("models/corpus/manifest.json"))
    parser.add_argument("--tokenizer", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--out", type=Path, default=Path("data/tokens"))
    args = parser.parse_args(argv)
    tok_file = args.tokenizer / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_file))
    domains = list(json.loads(args.manifest.read_text())["domains"])
    args.out.mkdir(parents=True, exist_ok=True)
    meta: dict = {
        "vocab_size": tok.get_vocab_size(),
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "tokenizer_sha256": hashlib.sha256(tok_file.read_bytes()).hexdigest(),
        "domains": {},
    }
    for domain in domains:
        meta["domains"][domain] = {}
        for split in SPLITS:
            texts = [d["text"] for d in read_split(args.corpus, domain, split)]
            stream = tokenize_documents(tok, texts)
            sha = write_stream(stream, stream_path(args.out, domain, split))
            nbytes = sum(len(t.encode("utf-8")) for t in texts)
            meta["domains"][domain][split] = {
                "documents": len(texts), "tokens": int(stream.size), "text_bytes": nbytes, "sha256": sha,
            }
            print(f"[tokens] {domain}/{split}: {len(texts)} docs, {stream.size} tokens, "
                  f"{nbytes / max(stream.size, 1):.2f} bytes/token")
    (args.out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
