"""Builds the training corpus of the project's own MoE model (pw-moe-tiny).

    .venv/bin/python -m models.corpus.build_corpus            # -> data/corpus/, models/corpus/manifest.json

Per domain (see sources.py): list files (sorted), clean, drop files that are not
UTF-8 text or are too small / too large, drop exact duplicates (across all
domains), then split BY FILE: every file gets the key sha256(seed/domain/path);
in key order files fill test, then validation, then train (up to a byte cap);
the rest stay unused. So a file lives in exactly one split, test files never
reach training, and the same source tree always gives the same corpus.

Output: ``<out>/<domain>/<split>.jsonl`` (one ``{"path", "text"}`` per line, in
key order) and a manifest (sources, package versions, byte counts, hashes, the
held-out file lists). The corpus itself is git-ignored; the manifest is committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from models.corpus.sources import DomainSource, default_sources

SPLITS = ("train", "validation", "test")
MANIFEST_VERSION = 1
DEFAULT_SEED = 20251129


class CorpusError(RuntimeError):
    """A domain cannot be built (missing source, too little text)."""


@dataclass(frozen=True)
class CorpusParams:
    """Sizes and seed of a build; part of the manifest."""

    seed: int = DEFAULT_SEED
    train_bytes: int = 12_000_000  # train split stops once it holds at least this much
    heldout_bytes: int = 400_000  # validation and test each stop at this much
    min_domain_bytes: int = 5_000_000  # a domain with less usable text is an error
    min_file_bytes: int = 256  # smaller files are mostly stubs and redirects
    max_file_bytes: int = 256 * 1024  # larger files are generated tables; one would dominate a split

    def validate(self) -> None:
        if self.heldout_bytes <= 0 or self.train_bytes <= 0:
            raise ValueError("split sizes must be positive")
        if not 0 < self.min_file_bytes < self.max_file_bytes:
            raise ValueError("need 0 < min_file_bytes < max_file_bytes")


@dataclass(frozen=True)
class Document:
    path: str  # relative to the domain root, POSIX
    text: str
    sha256: str  # of the cleaned text
    nbytes: int  # UTF-8 bytes of the cleaned text


def split_key(seed: int, domain: str, path: str) -> str:
    """The seeded hash that orders a domain's files for splitting."""
    return hashlib.sha256(f"{seed}/{domain}/{path}".encode()).hexdigest()


def collect(source: DomainSource, params: CorpusParams, seen: dict[str, str]) -> tuple[list[Document], dict]:
    """Clean and filter a domain's files. ``seen`` maps text sha256 -> "domain:path"
    of every document kept so far (dedup across domains); it is updated."""
    dropped = {"not_text": 0, "too_small": 0, "too_large": 0, "duplicate": 0}
    docs = []
    for file in source.list_files():
        rel = file.relative_to(source.root).as_posix()
        text = source.cleaner(file.read_bytes())
        if text is None:
            dropped["not_text"] += 1
            continue
        data = text.encode("utf-8")
        if len(data) < params.min_file_bytes:
            dropped["too_small"] += 1
            continue
        if len(data) > params.max_file_bytes:
            dropped["too_large"] += 1
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            dropped["duplicate"] += 1
            continue
        seen[digest] = f"{source.name}:{rel}"
        docs.append(Document(rel, text, digest, len(data)))
    return docs, dropped


def split_documents(docs: list[Document], domain: str, params: CorpusParams) -> dict[str, list[Document]]:
    """Assign whole files to test, validation, train (in that order of filling)."""
    ordered = sorted(docs, key=lambda d: split_key(params.seed, domain, d.path))
    targets = (("test", params.heldout_bytes), ("validation", params.heldout_bytes), ("train", params.train_bytes))
    splits: dict[str, list[Document]] = {name: [] for name in (*SPLITS, "unused")}
    stage, filled = 0, 0
    for doc in ordered:
        while stage < len(targets) and filled >= targets[stage][1]:
            stage, filled = stage + 1, 0
        name = targets[stage][0] if stage < len(targets) else "unused"
        splits[name].append(doc)
        filled += doc.nbytes
    return splits


def _list_digest(docs: list[Document]) -> str:
    lines = "".join(f"{d.path}\t{d.sha256}\n" for d in docs)
    return hashlib.sha256(lines.encode()).hexdigest()


def write_split(docs: list[Document], path: Path) -> str:
    """Writes one split as JSON lines; returns the file's sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps({"path": d.path, "text": d.text}, ensure_ascii=False) + "\n" for d in docs)
    raw = data.encode("utf-8")
    path.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Installed Debian package versions ("not installed" when absent)."""
    versions = {}
    for pkg in packages:
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
            versions[pkg] = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "not installed"
        except FileNotFoundError:
            versions[pkg] = "unknown (no dpkg-query)"
    return versions


def install_packages(packages: tuple[str, ...]) -> None:
    """apt-get install (with one apt-get update retry); raises CorpusError on failure."""
    if shutil.which("apt-get") is None:
        raise CorpusError(f"apt-get not found; install Debian packages {' '.join(packages)} by hand")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if subprocess.run(cmd, capture_output=True).returncode == 0:
        return
    subprocess.run(["apt-get", "update"], capture_output=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise CorpusError(f"apt-get install {' '.join(packages)} failed:\n{result.stderr[-2000:]}")


def collect_with_install(
    source: DomainSource, params: CorpusParams, seen: dict[str, str], install: bool
) -> tuple[list[Document], dict]:
    """collect(), installing the domain's packages once if it has too little text."""
    snapshot = dict(seen)
    docs, dropped = collect(source, params, seen)
    if sum(d.nbytes for d in docs) >= params.min_domain_bytes:
        return docs, dropped
    hint = f"install Debian package(s) {' '.join(source.apt_packages)}" if source.apt_packages else "no package known"
    if not (install and source.apt_packages):
        raise CorpusError(
            f"domain {source.name!r}: only {sum(d.nbytes for d in docs)} usable bytes under {source.root} "
            f"(need {params.min_domain_bytes}); {hint} (or run without --no-install as root)"
        )
    print(f"[corpus] {source.name}: too little text, installing {' '.join(source.apt_packages)}", file=sys.stderr)
    install_packages(source.apt_packages)
    seen.clear()
    seen.update(snapshot)
    docs, dropped = collect(source, params, seen)
    if sum(d.nbytes for d in docs) < params.min_domain_bytes:
        raise CorpusError(
            f"domain {source.name!r}: still only {sum(d.nbytes for d in docs)} usable bytes under {source.root} "
            f"after installing {' '.join(source.apt_packages)}"
        )
    return docs, dropped


def build(sources: list[DomainSource], params: CorpusParams, out_dir: Path, install: bool) -> dict:
    """Builds every domain into ``out_dir``; returns the manifest (not written)."""
    params.validate()
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate domain names: {names}")
    seen: dict[str, str] = {}
    manifest: dict = {"version": MANIFEST_VERSION, "params": asdict(params),
                      "python_version": platform.python_version(), "domains": {}}
    for source in sources:
        docs, dropped = collect_with_install(source, params, seen, install)
        splits = split_documents(docs, source.name, params)
        entry: dict = {
            "description": source.description,
            "root": str(source.root),
            "suffixes": list(source.suffixes),
            "packages": package_versions(source.apt_packages),
            "kept_files": len(docs),
            "kept_bytes": sum(d.nbytes for d in docs),
            "dropped_files": dropped,
            "splits": {},
        }
        for name in SPLITS:
            part = splits[name]
            sha = write_split(part, out_dir / source.name / f"{name}.jsonl")
            info = {"files": len(part), "bytes": sum(d.nbytes for d in part), "jsonl_sha256": sha,
                    "file_list_sha256": _list_digest(part)}
            if name != "train":
                info["paths"] = [d.path for d in part]
            entry["splits"][name] = info
        unused = splits["unused"]
        entry["unused"] = {"files": len(unused), "bytes": sum(d.nbytes for d in unused)}
        manifest["domains"][source.name] = entry
        sizes = ", ".join(f"{n} {entry['splits'][n]['bytes'] / 1e6:.2f} MB" for n in SPLITS)
        print(f"[corpus] {source.name}: {len(docs)} files kept; {sizes}", file=sys.stderr)
    return manifest


def read_split(corpus_dir: Path, domain: str, split: str) -> list[dict]:
    """The documents of one split, as written by build()."""
    path = corpus_dir / domain / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: run python -m models.corpus.build_corpus first")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--manifest", type=Path, default=Path("models/corpus/manifest.json"))
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--no-install", action="store_true", help="never run apt-get; fail naming the package")
    args = parser.parse_args(argv)
    params = CorpusParams(seed=args.seed)
    try:
        manifest = build(default_sources(), params, args.out, install=not args.no_install)
    except CorpusError as err:
        sys.exit(f"build_corpus: {err}")
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    args.manifest.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"[corpus] wrote {args.out} and {args.manifest}", file=sys.stderr)


if __name__ == "__main__":
    main()
