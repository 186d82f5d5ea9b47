"""benchmarks/cache_key_log.py's diagnosis: each key the dataplane computed,
paired with the precompile workers' key of the same variant."""

from __future__ import annotations

import json

from benchmarks.cache_key_log import diagnose


def entry(kernel: str, constants: str, key: str, **parts) -> dict:
    base = {"kernel": kernel, "fn_cache_key": "f", "attrs": "{}", "signature": "[]", "constants": constants,
            "backend": "b", "options": "o", "env": "[]", "key": key, "pid": 1}
    return {**base, **parts}


def test_pairs_keys_by_variant_and_names_the_differing_parts(tmp_path):
    main = [entry("_a", "1", "k1"), entry("_b", "2", "k2", env="[('X', '1')]"), entry("_c", "3", "k3")]
    worker = [entry("_a", "1", "k1"), entry("_b", "2", "k9")]
    for role, entries in (("main", main), ("worker", worker)):
        (tmp_path / f"keys-{role}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    result = diagnose(tmp_path)
    assert (result["main_keys"], result["worker_keys"], result["equal"]) == (3, 2, 1)
    assert result["no_worker_key"] == ["_c"]
    assert result["differ"] == [{"kernel": "_b", "parts": ["env"], "main_env": "[('X', '1')]", "worker_env": "[]"}]


def test_no_logs_is_an_empty_diagnosis(tmp_path):
    assert diagnose(tmp_path) == {"main_keys": 0, "worker_keys": 0, "equal": 0, "no_worker_key": [], "differ": []}
