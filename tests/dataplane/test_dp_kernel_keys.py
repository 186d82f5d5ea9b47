"""Triton cache keys taken before anything compiles (dataplane/kernel_keys.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from dataplane import app as app_module
from dataplane.app import Dataplane
from dataplane.kernel_keys import settle_cache_keys

ROOT = Path(__file__).resolve().parents[2]


# Under TRITON_INTERPRET (the test session's, tests/conftest.py) @triton.jit
# makes interpreted functions, which have no cache key: compiled-mode checks
# run in a fresh process without it.
KEYS_SCRIPT = """
import json
from dataplane.kernel_keys import jit_functions, settle_cache_keys
functions = jit_functions()
first = settle_cache_keys()
keys = {name: fn.hash for name, fn in functions.items()}
again = settle_cache_keys()
print(json.dumps({"names": list(functions), "first": first, "again": again, "keys": keys,
                  "kept": keys == {name: fn.hash for name, fn in functions.items()}}))
"""


def _compiled_mode(script: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_kernel_function_is_found_and_keyed_once():
    result = _compiled_mode(KEYS_SCRIPT)
    names = result["names"]
    # The launches the MoE layer and the decode step make, and device functions they call.
    for name in ("kernels.moe_gate_up._moe_gate_up_kernel", "kernels.moe_down._moe_down_kernel",
                 "kernels.moe_align._moe_prep_kernel", "kernels.moe_decode._rot_masks",
                 "kernels.rmsnorm._rmsnorm_kernel", "kernels.paged_attention._decode_kernel"):
        assert name in names, name
    assert names == sorted(names)  # one fixed order in every process
    assert result["first"] == result["again"] == len(names)
    assert all(isinstance(k, str) and len(k) == 64 for k in result["keys"].values())  # sha256 hex
    assert result["kept"]  # taken once, then kept


def test_a_function_without_a_key_is_skipped_not_fatal(monkeypatch):
    class Unhashable:
        @property
        def cache_key(self):
            raise RuntimeError("no source")

    functions = {"kernels.x._ok": SimpleNamespace(cache_key="k"), "kernels.x._bad": Unhashable()}
    monkeypatch.setattr("dataplane.kernel_keys.jit_functions", lambda package="kernels": functions)
    assert settle_cache_keys() == 1


def test_the_dataplane_settles_keys_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(app_module, "settle_cache_keys", lambda: calls.append(1) or 7)
    on_cpu = SimpleNamespace(resolved_device=lambda: torch.device("cpu"))
    on_cuda = SimpleNamespace(resolved_device=lambda: torch.device("cuda"))
    assert Dataplane._settle_kernel_keys(on_cpu) is None and calls == []
    assert Dataplane._settle_kernel_keys(on_cuda) == 7 and calls == [1]


def test_settled_keys_do_not_change_when_a_kernel_compiles(tmp_path):
    # benchmarks/cache_key_order_probe.py: fresh processes, one compiling the
    # MoE down kernel for sm_90 (no GPU needed) after settling the keys.
    out = tmp_path / "probe.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cache_key_order_probe.py"), "--out", str(out),
                    "--commit", "0a1b2c3"], check=True, env=env, cwd=ROOT, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    assert result["commit"] == "0a1b2c3"  # the measured tree's, as on the GPU machine (stale .git)
    assert result["settled_stable"], result["keys"]
    assert set(result["keys"]) == {"fresh", "after_compile", "settled", "settled_after_compile"}


def test_a_module_that_fails_to_import_is_skipped(tmp_path, monkeypatch, caplog):
    package = tmp_path / "pw_fake_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a_broken.py").write_text("raise ImportError('needs a driver')\n")
    (package / "b_fine.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from dataplane.kernel_keys import jit_functions

    with caplog.at_level("WARNING", logger="dataplane.kernel_keys"):
        assert jit_functions("pw_fake_kernels") == {}
    assert "pw_fake_kernels.a_broken" in caplog.text and "needs a driver" in caplog.text
