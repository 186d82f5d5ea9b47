"""Windows of the tokenized corpus (data/tokens, built by
models/train/tokenize_corpus.py) for calibration and evaluation.

A subset of a split is ``count`` non-overlapping windows spread evenly over
the whole split (window indices rounded from a linear grid), so it samples
many documents rather than the first few; it is deterministic. The counting
rule of the targets is models/train/lm_eval.py's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from models.train.lm_eval import EvalWindows, make_windows
from models.train.tokenize_corpus import load_meta, load_stream


def corpus_domains(tokens_dir: str | Path) -> list[str]:
    """Domains of the tokenized corpus, in meta.json order."""
    return list(load_meta(Path(tokens_dir))["domains"])


def split_windows(tokens_dir: str | Path, domain: str, split: str, seq_len: int, count: int) -> EvalWindows:
    """``count`` windows of ``seq_len`` inputs spread evenly over the split
    (all of them when the split has fewer)."""
    if count <= 0 or seq_len <= 1:
        raise ValueError(f"count must be positive and seq_len > 1, got {count}, {seq_len}")
    tokens_dir = Path(tokens_dir)
    meta = load_meta(tokens_dir)
    if domain not in meta["domains"]:
        raise ValueError(f"domain {domain!r} not in the corpus ({', '.join(meta['domains'])})")
    stream = load_stream(tokens_dir, domain, split)
    every = make_windows(stream, seq_len, meta["bos_id"])
    total = every.inputs.shape[0]
    idx = torch.from_numpy(np.unique(np.round(np.linspace(0, total - 1, min(count, total))).astype(np.int64)))
    return EvalWindows(every.inputs[idx], every.targets[idx])


def windows_digest(windows: list[torch.Tensor]) -> str:
    """sha256 of the token ids of ``windows`` (each [N, S] int64), in order."""
    digest = hashlib.sha256()
    for w in windows:
        digest.update(w.to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()
