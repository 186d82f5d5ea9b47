"""Logs the parts of every Triton disk-cache key a process computes, for
``benchmarks/cold_start.py --key-log`` (why a preloaded variant misses).

On the H100 the precompiled start's warm-up still compiled 12-15 of the 22
MoE variants its workers had preloaded, a different subset each run, while
every other kernel's variants loaded; one process that launches and then
preloads the same variants computes equal keys (preload_key_probe_h100_s45.json).
So the cold-start child installs ``install(log_dir, "main")`` and precompiles
through ``logged_preload``, whose workers log as "worker": ``diagnose`` then
pairs each key the dataplane computed with the workers' key for the same
variant and names the parts that differ.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from benchmarks.preload_key_probe import key_parts

KEY_LOG_ENV = "PW_CACHE_KEY_LOG"
# The parts that name a variant (the rest, the options' hash included, are what
# a key could differ in; variants alike but in options are told apart by key).
IDENTITY = ("kernel", "signature", "constants", "attrs")


@functools.cache
def install(log_dir: str, role: str) -> None:
    """Wraps Triton's get_cache_key in this process (once) to append each
    key's parts to ``log_dir/keys-<role>.jsonl``."""
    from triton.compiler import compiler as tcompiler

    original = tcompiler.get_cache_key
    path = Path(log_dir, f"keys-{role}.jsonl")

    def logging_get_cache_key(src, backend, backend_options, env_vars):
        key = original(src, backend, backend_options, env_vars)
        parts = key_parts(src, backend, backend_options, env_vars)
        parts.pop("options_dict")
        parts["key"] = hashlib.sha256(key.encode()).hexdigest()
        parts["pid"] = os.getpid()
        with path.open("a") as f:
            f.write(json.dumps(parts) + "\n")
        return key

    tcompiler.get_cache_key = logging_get_cache_key


def logged_preload(module: str, qualname: str, specialization: str) -> str | None:
    """A precompile worker's preload with its keys logged (the log folder from
    KEY_LOG_ENV, inherited from the child that spawned it)."""
    from dataplane.kernel_precompile import preload_variant

    install(os.environ[KEY_LOG_ENV], "worker")
    return preload_variant(module, qualname, specialization)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def diagnose(log_dir: str | Path) -> dict:
    """Each key the dataplane computed against the workers' key of the same
    variant: how many matched, had no worker key, or differed, and in which parts."""
    main, workers = _read(Path(log_dir, "keys-main.jsonl")), _read(Path(log_dir, "keys-worker.jsonl"))
    by_identity: dict[tuple, list[dict]] = {}
    for entry in workers:
        by_identity.setdefault(tuple(entry[k] for k in IDENTITY), []).append(entry)
    result = {"main_keys": len(main), "worker_keys": len(workers), "equal": 0, "no_worker_key": [], "differ": []}
    for entry in main:
        theirs = by_identity.get(tuple(entry[k] for k in IDENTITY), [])
        if any(w["key"] == entry["key"] for w in theirs):
            result["equal"] += 1
        elif not theirs:
            result["no_worker_key"].append(entry["kernel"])
        else:
            other = theirs[0]
            parts = [k for k in entry if k not in ("key", "pid") and entry[k] != other[k]]
            result["differ"].append({"kernel": entry["kernel"], "parts": parts,
                                     **{f"main_{k}": entry[k] for k in parts},
                                     **{f"worker_{k}": other[k] for k in parts}})
    return result
