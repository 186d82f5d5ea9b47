"""Corpus builder: determinism, split disjointness, dedup, filters, manifest format."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from models.corpus.build_corpus import SPLITS, CorpusError, CorpusParams, build, read_split, split_key
from models.corpus.sources import DomainSource, clean_manpage, clean_plain, roff_to_text

REPO = Path(__file__).resolve().parents[2]
SMALL = CorpusParams(seed=7, train_bytes=3000, heldout_bytes=700, min_domain_bytes=2000,
                     min_file_bytes=40, max_file_bytes=2000)


def _write_tree(root: Path) -> None:
    """Two domains of small files, with a duplicate, a binary, a tiny and a huge file."""
    code, prose = root / "code", root / "prose"
    for i in range(40):
        (code / f"pkg{i % 4}").mkdir(parents=True, exist_ok=True)
        (code / f"pkg{i % 4}" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (3 + i % 5))
    (code / "pkg0" / "copy_of_mod1.py").write_text((code / "pkg1" / "mod1.py").read_text())
    (code / "pkg0" / "binary.py").write_bytes(b"\x00\x01\x02 not text" * 10)
    (code / "pkg0" / "tiny.py").write_text("x = 1\n")
    (code / "pkg0" / "huge.py").write_text("y = 2\n" * 1000)
    (code / "site-packages").mkdir()
    (code / "site-packages" / "excluded.py").write_text("z = 3\n" * 20)
    prose.mkdir(parents=True)
    for i in range(30):
        (prose / f"chapter{i:02d}.rst.txt").write_text(f"Chapter {i}\n==========\n\n" + f"Sentence number {i}. " * 20)


def _sources(root: Path) -> list[DomainSource]:
    return [
        DomainSource("code", "fake code", root / "code", (".py",), ("site-packages",), clean_plain, ()),
        DomainSource("prose", "fake prose", root / "prose", (".rst.txt",), (), clean_plain, ("fake-doc-pkg",)),
    ]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    _write_tree(tmp_path / "src")
    return tmp_path / "src"


def test_build_is_deterministic(tree: Path, tmp_path: Path) -> None:
    first = build(_sources(tree), SMALL, tmp_path / "a", install=False)
    second = build(_sources(tree), SMALL, tmp_path / "b", install=False)
    assert first == second
    for domain in ("code", "prose"):
        for split in SPLITS:
            a = (tmp_path / "a" / domain / f"{split}.jsonl").read_bytes()
            assert a == (tmp_path / "b" / domain / f"{split}.jsonl").read_bytes()
            assert hashlib.sha256(a).hexdigest() == first["domains"][domain]["splits"][split]["jsonl_sha256"]


def test_splits_are_disjoint_files_and_respect_sizes(tree: Path, tmp_path: Path) -> None:
    manifest = build(_sources(tree), SMALL, tmp_path / "c", install=False)
    for domain in ("code", "prose"):
        docs = {split: read_split(tmp_path / "c", domain, split) for split in SPLITS}
        paths = {split: {d["path"] for d in docs[split]} for split in SPLITS}
        texts = {split: {d["text"] for d in docs[split]} for split in SPLITS}
        assert not paths["train"] & paths["test"] and not paths["train"] & paths["validation"]
        assert not paths["validation"] & paths["test"]
        assert not texts["train"] & texts["test"]
        assert all(docs[s] for s in SPLITS), "every split got files"
        entry = manifest["domains"][domain]["splits"]
        assert entry["test"]["paths"] == [d["path"] for d in docs["test"]]
        assert "paths" not in entry["train"]
        # a held-out split stops at the first file that reaches its target
        last = max(len(d["text"].encode()) for d in docs["test"])
        assert SMALL.heldout_bytes <= entry["test"]["bytes"] < SMALL.heldout_bytes + last
        # files are taken in seeded-hash order: test keys all come before validation keys
        keys = {s: [split_key(SMALL.seed, domain, d["path"]) for d in docs[s]] for s in SPLITS}
        assert keys["test"] == sorted(keys["test"]) and max(keys["test"]) < min(keys["validation"])


def test_filters_and_dedup_are_counted(tree: Path, tmp_path: Path) -> None:
    manifest = build(_sources(tree), SMALL, tmp_path / "d", install=False)
    dropped = manifest["domains"]["code"]["dropped_files"]
    assert dropped == {"not_text": 1, "too_small": 1, "too_large": 1, "duplicate": 1}
    all_paths = {d["path"] for s in SPLITS for d in read_split(tmp_path / "d", "code", s)}
    assert not any("site-packages" in p for p in all_paths)
    assert "pkg0/binary.py" not in all_paths and "pkg0/huge.py" not in all_paths


def test_seed_changes_assignment_not_content(tree: Path, tmp_path: Path) -> None:
    a = build(_sources(tree), SMALL, tmp_path / "s1", install=False)
    other = CorpusParams(**{**SMALL.__dict__, "seed": 8})
    b = build(_sources(tree), other, tmp_path / "s2", install=False)
    assert a["domains"]["prose"]["kept_files"] == b["domains"]["prose"]["kept_files"]
    assert a["domains"]["prose"]["splits"]["test"]["paths"] != b["domains"]["prose"]["splits"]["test"]["paths"]


def test_missing_source_names_the_package(tmp_path: Path) -> None:
    missing = [DomainSource("prose", "x", tmp_path / "nowhere", (".txt",), (), clean_plain, ("fake-doc-pkg",))]
    with pytest.raises(CorpusError, match="fake-doc-pkg"):
        build(missing, SMALL, tmp_path / "out", install=False)


def test_roff_cleaning_keeps_words_and_drops_markup() -> None:
    page = ('.\\" Copyright (c) someone, licence text\n.TH LS 1\n.SH BESCHREIBUNG\n.PP\n'
            'Einträge \\fBnicht\\fP ignorieren, die mit »\\-a« beginnen\n.TP\n.B \\-\\-all\nalle zeigen\n')
    text = roff_to_text(page)
    assert "Copyright" not in text and ".TP" not in text and "\\f" not in text
    assert "BESCHREIBUNG" in text and "Einträge nicht ignorieren, die mit »-a« beginnen" in text
    assert "--all" in text
    assert clean_manpage(gzip.compress(page.encode())) == text
    assert clean_manpage(b"not gzip") is None


def test_committed_manifest_format() -> None:
    manifest = json.loads((REPO / "models/corpus/manifest.json").read_text())
    assert manifest["version"] == 1 and len(manifest["domains"]) >= 3
    params = manifest["params"]
    for name, entry in manifest["domains"].items():
        splits = entry["splits"]
        assert entry["kept_bytes"] >= params["min_domain_bytes"] >= 5_000_000, name
        assert 5_000_000 <= splits["train"]["bytes"] <= 15_000_000, name
        for held in ("validation", "test"):
            assert 300_000 <= splits[held]["bytes"] <= 600_000, (name, held)
            assert len(splits[held]["paths"]) == splits[held]["files"]
            assert len(splits[held]["jsonl_sha256"]) == 64
        assert not set(splits["validation"]["paths"]) & set(splits["test"]["paths"])
        assert all(v != "not installed" for v in entry["packages"].values()), name
