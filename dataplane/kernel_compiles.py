"""Triton kernel variants compiled while the dataplane runs.

A kernel variant compiled in the middle of serving stalls the step that
needs it for seconds (2.7 s for one MoE prep variant in a Mixtral-8x7B burst
on the H100; benchmarks/NOTES.md, session 43). The start-up warm-up
(dataplane/warmup.py) is meant to compile every variant a step can need; a
compile after it is a gap in that coverage, which operators see here as
``EngineStats.kernel_compiles_total`` (the gateway's
``pagedweight_engine_kernel_compiles_total``) and as a warning naming the
kernel.

Counted through Triton's ``knobs.runtime.jit_cache_hook``, which Triton calls
before it compiles (or loads from its disk cache) a variant its in-memory
cache lacks. The knob is process-wide: one watch per dataplane process,
installed by ``Dataplane.start`` and removed by ``stop``. The interpreter
(TRITON_INTERPRET=1, the CPU) compiles nothing and never calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dataplane.kernel_manifest import KernelVariant, variant_from_hook

log = logging.getLogger(__name__)


class CompileWatch:
    """Calls ``on_compile(kernel_name)`` for each Triton kernel variant
    compiled while installed, and logs it: at debug level until
    ``serving`` is set (the warm-up's compiles are expected), then as a
    warning. With ``on_variant``, each variant Triton compiles or loads from
    its disk cache is also handed over whole (dataplane/kernel_manifest.py)."""

    def __init__(self, on_compile: Callable[[str], None],
                 on_variant: Callable[[KernelVariant], None] | None = None) -> None:
        self._on_compile = on_compile
        self._on_variant = on_variant
        self._previous = None
        self._installed = False
        self.serving = False

    def install(self) -> bool:
        """Chains in front of any hook already set; False when Triton has no
        such knob (then nothing is counted)."""
        knobs = _runtime_knobs()
        if knobs is None or self._installed:
            return self._installed
        self._previous = knobs.jit_cache_hook
        knobs.jit_cache_hook = self._hook
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Restores the hook found at install when this one is still the
        knob's; else (another hook was chained in front since) only stops
        counting."""
        if not self._installed:
            return
        self._installed = False
        knobs = _runtime_knobs()
        if knobs is not None and knobs.jit_cache_hook == self._hook:
            knobs.jit_cache_hook = self._previous

    def _hook(self, *args, **kwargs):
        if self._installed:
            name = getattr(kwargs.get("fn"), "name", "?")
            self._on_compile(name)
            variant = variant_from_hook(kwargs) if self._on_variant is not None else None
            if variant is not None:
                self._on_variant(variant)
            if self.serving:
                # The variant (Triton's repr and its specialization data: argument types with
                # their specializations, constexprs, launch options) says which shape the
                # warm-up missed.
                spec = (kwargs.get("compile") or {}).get("specialization_data", "")
                log.warning("Triton compiled a variant of %s while serving: the step waits for it "
                            "(a shape the start-up warm-up did not cover): %s %s", name, kwargs.get("repr", "?"),
                            spec)
            else:
                log.debug("Triton compiles a variant of %s", name)
        # The chained hook decides; None/False: Triton goes on and compiles.
        return self._previous(*args, **kwargs) if self._previous is not None else False


def _runtime_knobs():
    try:
        import triton
    except ImportError:
        return None
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    return knobs if knobs is not None and hasattr(knobs, "jit_cache_hook") else None
