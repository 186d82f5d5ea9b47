"""Compiles a kernel manifest's variants in parallel before the dataplane's build.

The warm-up (dataplane/warmup.py) compiles each Triton variant the moment a
step first launches it, one at a time on the engine thread. Here the variants
of a manifest (dataplane/kernel_manifest.py) are compiled first, each in one
of ``workers`` threads of this process by ``JITFunction.preload``, which
writes Triton's disk cache and the kernel's in-memory cache: the warm-up's
launches then find them there. Triton's LLVM stages release the GIL and
ptxas is a subprocess, so the threads still use the host's cores while the
engine would have used one.

Why threads of this process, not spawned processes: on the H100 with
synthetic Mixtral-8x7B (benchmarks/results/cold_start_keys_h100_s46.json,
benchmarks/NOTES.md session 46) a cold start took 198.0 s to serving (184.8 s
of warm-up, 77 compiles). Precompiled in 16 processes: 31.1 s of precompile,
121.4 s of warm-up, 160.8 s to serving, and the warm-up compiled 14 variants
again, because the MoE gate-up and down kernels' source hash
(``fn_cache_key``) differed between the workers and the dataplane.
Precompiled in 16 threads: 27.1 s of precompile, 7.2 s of warm-up, 43.2 s to
serving, no compile in the warm-up. (The cause of the misses, found later:
Triton 3.6's keys depend on what a process compiled first;
dataplane/kernel_keys.py now settles them up front. Threads stay: no
interpreter start or imports per worker.)

The manifest is advisory: a variant that fails to preload (another Triton,
GPU or kernel source) is counted and named in the report, and the warm-up
compiles what it needs as before.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from dataplane.kernel_keys import settle_cache_keys
from dataplane.kernel_manifest import KernelVariant

log = logging.getLogger(__name__)

# Failures named in the report (the rest are only counted).
REPORTED_FAILURES = 5

Preload = Callable[[str, str, str], str | None]


@dataclass
class PrecompileReport:
    variants: int
    compiled: int
    failed: int
    workers: int
    seconds: float
    failures: list[str] = field(default_factory=list)  # the first REPORTED_FAILURES, "module.name: error"


def resolve_kernel(module: str, qualname: str):
    """The object with ``preload`` that ``module``'s ``qualname`` names (a
    ``@triton.jit`` function, or one under autotune/heuristics wrappers)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not hasattr(obj, "preload") and hasattr(obj, "fn"):
        obj = obj.fn
    if not hasattr(obj, "preload"):
        raise TypeError(f"{module}.{qualname} is not a Triton kernel")
    return obj


def preload_variant(module: str, qualname: str, specialization: str) -> str | None:
    """Thread body: compiles one variant into the disk cache, and the launcher
    stub its signature needs (Triton 3.6 builds one per signature with the C
    compiler, also cached on disk: 14 of the 77 entries a cold Mixtral-8x7B
    warm-up wrote, benchmarks/results/cold_start_h100_s45.json); returns None,
    or what went wrong (never raises, so one bad variant costs only itself)."""
    try:
        kernel = resolve_kernel(module, qualname).preload(specialization)
        _build_launcher(kernel)
    except Exception as err:  # any failure is the variant's, reported by name
        return f"{module}.{qualname}: {type(err).__name__}: {err}"
    return None


def _build_launcher(kernel) -> None:
    """Builds the kernel's launcher as its first launch would (without loading
    the kernel onto the GPU); nothing where Triton has no such class."""
    from triton.runtime import driver

    launcher_cls = getattr(driver.active, "launcher_cls", None)
    if kernel is not None and launcher_cls is not None and hasattr(kernel, "src"):
        launcher_cls(kernel.src, kernel.metadata)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _prepare_in_this_process(variants: list[KernelVariant]) -> None:
    """Before the threads preload, on this thread: every kernel's cache key
    taken in one fixed order (dataplane/kernel_keys.py; a no-op after the
    Dataplane's own settle), and each manifest kernel's per-device cache made
    once (Triton creates it lazily, unguarded). A kernel that fails here fails
    again in its preload, which reports it."""
    from triton.runtime import driver

    settle_cache_keys()
    for module, qualname in dict.fromkeys((v.module, v.qualname) for v in variants):
        try:
            kernel = resolve_kernel(module, qualname)
            caches = getattr(kernel, "device_caches", None)
            if caches is not None:
                _ = caches[driver.active.get_current_device()]
        except Exception:  # reported by the variant's own preload
            continue


def precompile(variants: list[KernelVariant], workers: int = 0,
               preload: Preload = preload_variant) -> PrecompileReport:
    """Compiles ``variants`` in up to ``workers`` threads of this process (0:
    one per usable core) and waits for all of them; this leaves the variants
    in Triton's disk cache and in the kernels' in-memory caches. ``preload``
    compiles one variant (a stand-in in tests). Never raises for a variant:
    the report counts what failed (the manifest is advisory)."""
    start = time.perf_counter()
    workers = min(workers or default_workers(), len(variants))
    if workers == 0:
        return PrecompileReport(0, 0, 0, 0, 0.0)
    if preload is preload_variant:
        _prepare_in_this_process(variants)
    failures: list[str] = []
    compiled = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="precompile") as pool:
        pending: dict[Future, KernelVariant] = {
            pool.submit(preload, v.module, v.qualname, v.specialization): v for v in variants
        }
        for future in as_completed(pending):
            variant = pending[future]
            try:
                error = future.result()
            except Exception as err:  # a preload that raised: the variant's failure
                error = f"{variant.module}.{variant.qualname}: {type(err).__name__}: {err}"
            if error is None:
                compiled += 1
            else:
                failures.append(error)
    report = PrecompileReport(len(variants), compiled, len(failures), workers, time.perf_counter() - start,
                              failures[:REPORTED_FAILURES])
    log.info("precompiled %d of %d kernel variants in %.1f s on %d threads", report.compiled,
             report.variants, report.seconds, report.workers)
    for failure in report.failures:
        log.warning("kernel variant not precompiled (the warm-up compiles it if needed): %s", failure)
    return report
