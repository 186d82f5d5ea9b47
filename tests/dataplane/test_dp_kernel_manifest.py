"""Kernel manifests (dataplane/kernel_manifest.py) and their parallel
precompile (dataplane/kernel_precompile.py).

On the CPU Triton's interpreter compiles nothing, so Triton's hook calls are
made by hand (as in test_dp_kernel_compiles.py) and the precompile threads
run a stand-in preload; the GPU test below records a real variant and
preloads it into an empty disk cache."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

from dataplane.app import Dataplane
from dataplane.config import DataplaneConfig
from dataplane.kernel_compiles import CompileWatch
from dataplane.kernel_manifest import KernelVariant, VariantRecorder, read_manifest, variant_from_hook, write_manifest
from dataplane import kernel_precompile
from dataplane.kernel_precompile import REPORTED_FAILURES, precompile, preload_variant, resolve_kernel
from kernels import row_argmax as row_argmax_module
from tests.dataplane.precompile_helpers import record_preload


def hook_kwargs(jit_function, specialization: str | None) -> dict:
    """The keyword arguments Triton passes jit_cache_hook for a variant of ``jit_function``."""
    compile_info = {} if specialization is None else {"specialization_data": specialization}
    return dict(key="k", repr="r", fn=SimpleNamespace(name=jit_function.fn.__qualname__, jit_function=jit_function),
                compile=compile_info, is_manual_warmup=False, already_compiled=False)


def test_recorder_keeps_first_seen_order_without_duplicates(tmp_path):
    a, b = KernelVariant("kernels.x", "_a", '{"n": 1}'), KernelVariant("kernels.x", "_b", '{"n": 2}')
    recorder = VariantRecorder()
    for v in (a, b, a, b, a):
        recorder.add(v)
    path = tmp_path / "sub" / "manifest.json"
    assert recorder.write(path) == 2
    assert read_manifest(path) == [a, b]
    body = json.loads(path.read_text())
    assert body["format"] == 1 and body["triton"] == triton.__version__
    assert not list(path.parent.glob(".*tmp"))  # written through a temporary file, renamed


@pytest.mark.parametrize("content, fault", [
    (None, "cannot read it"),
    ("{not json", "not JSON"),
    ('{"format": 2, "variants": []}', '"format": 1'),
    ('{"format": 1, "variants": {}}', "must be a list"),
    ('{"format": 1, "variants": [{"module": "m", "qualname": "", "specialization": "{}"}]}', "variant 0"),
    ('{"format": 1, "variants": ["m._k"]}', "variant 0"),
])
def test_a_bad_manifest_is_a_clear_error(tmp_path, content, fault):
    path = tmp_path / "manifest.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=fault) as info:
        read_manifest(path)
    assert str(path) in str(info.value)


def test_a_hook_call_names_the_kernel_by_import_path():
    kernel = row_argmax_module._row_argmax_kernel
    variant = variant_from_hook(hook_kwargs(kernel, '{"x": 1}'))
    assert variant == KernelVariant("kernels.row_argmax", "_row_argmax_kernel", '{"x": 1}')
    if hasattr(kernel, "preload"):
        assert resolve_kernel(variant.module, variant.qualname) is kernel
    else:  # TRITON_INTERPRET=1: an interpreted function, nothing to preload
        with pytest.raises(TypeError, match="not a Triton kernel"):
            resolve_kernel(variant.module, variant.qualname)
    assert variant_from_hook(hook_kwargs(kernel, None)) is None  # no specialization data: nothing to preload

    @triton.jit
    def _local_kernel(x_ptr):
        pass

    assert variant_from_hook(hook_kwargs(_local_kernel, '{"x": 1}')) is None  # not importable by name


def test_compile_watch_hands_over_each_variant(no_hook):
    seen_names, variants = [], []
    watch = CompileWatch(seen_names.append, variants.append)
    watch.install()
    try:
        triton.knobs.runtime.jit_cache_hook(**hook_kwargs(row_argmax_module._row_argmax_kernel, '{"x": 2}'))
    finally:
        watch.uninstall()
    assert seen_names == ["_row_argmax_kernel"]
    assert variants == [KernelVariant("kernels.row_argmax", "_row_argmax_kernel", '{"x": 2}')]


def test_resolve_kernel_refuses_what_is_not_a_kernel():
    with pytest.raises(TypeError, match="not a Triton kernel"):
        resolve_kernel("kernels.row_argmax", "row_argmax")
    with pytest.raises(AttributeError):
        resolve_kernel("kernels.row_argmax", "_no_such_kernel")


def test_preload_reports_instead_of_raising():
    error = preload_variant("kernels.row_argmax", "_row_argmax_kernel", "{not json")
    assert error is not None and error.startswith("kernels.row_argmax._row_argmax_kernel: ")
    assert preload_variant("kernels.no_such_module", "_k", "{}").startswith("kernels.no_such_module._k: ")


def test_precompile_runs_every_variant_in_threads_of_this_process(tmp_path):
    variants = [KernelVariant("kernels.x", "_k", json.dumps({"folder": str(tmp_path), "n": n})) for n in range(5)]
    variants.append(KernelVariant("kernels.x", "_k", json.dumps({"bad": True})))
    report = precompile(variants, workers=2, preload=record_preload)
    assert (report.variants, report.compiled, report.failed, report.workers) == (6, 5, 1, 2)
    assert report.failures == ["kernels.x._k: refused"]
    made = sorted(p.name.split("-") for p in tmp_path.iterdir())
    assert [n for _, n, _, _ in made] == ["0", "1", "2", "3", "4"]
    assert {int(pid) for _, _, pid, _ in made} == {os.getpid()}
    assert all(thread.startswith("precompile") for _, _, _, thread in made)
    assert precompile([], workers=4, preload=record_preload).workers == 0


def test_precompile_threads_run_side_by_side():
    # Each preload waits for the other two: run one after another, all three would fail.
    barrier = threading.Barrier(3, timeout=10)

    def preload(module: str, qualname: str, specialization: str) -> None:
        barrier.wait()

    variants = [KernelVariant("kernels.x", "_k", str(n)) for n in range(3)]
    report = precompile(variants, workers=3, preload=preload)
    assert (report.compiled, report.failed, report.workers) == (3, 0, 3), report.failures


def test_a_failing_preload_is_reported_by_name_and_does_not_raise(monkeypatch):
    def preload(module: str, qualname: str, specialization: str) -> str | None:
        if specialization == "raise":
            raise RuntimeError("boom")
        return f"{module}.{qualname}: refused" if specialization == "refuse" else None

    variants = [KernelVariant("kernels.x", "_ok", "ok"), KernelVariant("kernels.x", "_raises", "raise"),
                KernelVariant("kernels.y", "_refuses", "refuse")]
    report = precompile(variants, workers=2, preload=preload)
    assert (report.compiled, report.failed) == (1, 2)
    assert sorted(report.failures) == ["kernels.x._raises: RuntimeError: boom", "kernels.y._refuses: refused"]
    many = [KernelVariant("kernels.x", f"_k{n}", "raise") for n in range(REPORTED_FAILURES + 2)]
    report = precompile(many, workers=2, preload=preload)
    assert (report.failed, len(report.failures)) == (REPORTED_FAILURES + 2, REPORTED_FAILURES)
    # Triton's own preload on a variant it cannot compile here (the interpreter; a bad specialization),
    # after the kernels are prepared on this thread (only for Triton's preload).
    prepared = []
    monkeypatch.setattr(kernel_precompile, "_prepare_in_this_process", prepared.append)
    bad = KernelVariant("kernels.row_argmax", "_row_argmax_kernel", "{not json")
    report = precompile([bad], workers=1)
    assert (report.compiled, report.failed) == (0, 1)
    assert report.failures[0].startswith("kernels.row_argmax._row_argmax_kernel: ")
    assert prepared == [[bad]]
    precompile([bad], workers=1, preload=preload)
    assert prepared == [[bad]]


def _config(model: str, **overrides) -> DataplaneConfig:
    fields = dict(model_path=model, device="cpu", dtype="float32", cpu_arena_bytes=8 << 20, max_running_seqs=4,
                  max_batched_tokens=64, max_context_length=256)
    return DataplaneConfig(**{**fields, **overrides})


def test_dataplane_writes_its_manifest_and_reads_one(random_ckpt, tmp_path):
    out = tmp_path / "out.json"
    dataplane = Dataplane(_config(str(random_ckpt), kernel_manifest_out=str(out)))
    dataplane.start()
    try:
        assert read_manifest(out) == []  # written once serving (the CPU interpreter compiles nothing)
    finally:
        dataplane.stop()
    variant = KernelVariant("kernels.row_argmax", "_row_argmax_kernel", "{}")
    write_manifest(tmp_path / "in.json", [variant])
    reader = Dataplane(_config(str(random_ckpt), kernel_manifest=str(tmp_path / "in.json"),
                               kernel_manifest_out=str(tmp_path / "out2.json")))
    assert reader.precompiled is None  # on the CPU nothing is precompiled
    reader.start()
    reader.stop()
    assert read_manifest(tmp_path / "out2.json") == [variant]  # what it read is carried into what it writes
    (tmp_path / "broken.json").write_text("[]")
    with pytest.raises(ValueError, match="broken.json"):
        Dataplane(_config(str(random_ckpt), kernel_manifest=str(tmp_path / "broken.json")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_a_recorded_variant_preloads_into_an_empty_cache(tmp_path, monkeypatch, no_hook):
    recorder = VariantRecorder()
    watch = CompileWatch(lambda name: None, recorder.add)
    watch.install()
    try:
        # An odd width: a variant no other test compiles (the hook fires on a disk-cache load too).
        row_argmax_module.row_argmax(torch.randn(3, 4099, device="cuda"))
        torch.cuda.synchronize()
    finally:
        watch.uninstall()
    variants = [v for v in recorder.variants() if v.qualname == "_row_argmax_kernel"]
    assert len(variants) == 1
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    report = precompile(variants, workers=1)
    assert (report.compiled, report.failed) == (1, 0), report.failures
    assert any(cache.rglob("*.cubin"))


def test_manifest_flags_and_environment_reach_the_config(monkeypatch):
    from dataplane.__main__ import parse_args

    monkeypatch.setenv("PW_DATAPLANE_PRECOMPILE_WORKERS", "3")
    overrides = parse_args(["--model", "/m", "--kernel-manifest", "/in.json", "--kernel-manifest-out", "/out.json"])
    cfg = DataplaneConfig(**overrides)
    assert (cfg.kernel_manifest, cfg.kernel_manifest_out, cfg.precompile_workers) == ("/in.json", "/out.json", 3)
    assert parse_args(["--model", "/m", "--precompile-workers", "2"])["precompile_workers"] == 2
    with pytest.raises(ValueError):
        DataplaneConfig(model_path="/m", precompile_workers=-1)
