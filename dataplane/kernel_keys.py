"""Triton cache keys that do not depend on what this process compiled first.

Triton 3.6 (the GPU image's) hashes a ``@triton.jit`` function lazily, the
first time its key is asked for: its source, its dependencies' keys and the
constexpr globals they were seen to read, and then keeps it. What a
dependency was seen to read grows as kernels compile (compiling the MoE down
kernel adds kernels/moe_decode's rotation masks to the device functions it
inlines) and as other keys are taken, so a kernel's key depends on what the
process compiled and hashed before it. Reproduced on the CPU with Triton
3.6's wheel (benchmarks/cache_key_order_probe.py,
benchmarks/results/cache_key_order_probe_triton36_cpu.json): after the down
kernel compiled, the gate/up and down kernels' keys differ from a fresh
process's. On the H100 this made 14 of 64 precompiled variants miss the disk
cache when they were compiled in worker processes, each compiling its own
variants in its own order (benchmarks/NOTES.md, session 46). Triton 3.9
(this project's CPU pin) does not show it.

settle_cache_keys takes every kernel's key up front, in a fixed order, before
anything compiles: every process that settles first computes the same keys,
whatever it compiles first (precompile threads, the warm-up, a restart).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

log = logging.getLogger(__name__)


def jit_functions(package: str = "kernels") -> dict[str, object]:
    """{"module.name": JITFunction} for every ``@triton.jit`` function defined
    in ``package``'s modules (under autotune/heuristics wrappers too), in name
    order. A module that fails to import is logged and skipped: its kernels
    are hashed at their first launch, as before."""
    from triton.runtime.jit import JITFunction

    root = importlib.import_module(package)
    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except Exception as err:  # advisory, like the keys themselves
            log.warning("kernel module %s.%s not imported for its cache keys: %s: %s", package, info.name,
                        type(err).__name__, err)
            continue
        for name, obj in sorted(vars(module).items()):
            while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
                obj = obj.fn
            if isinstance(obj, JITFunction) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def settle_cache_keys(package: str = "kernels") -> int:
    """Takes the cache key of every jit function of ``package`` now (see the
    module doc); returns how many. A function whose key cannot be taken is
    logged and left to be hashed when first launched, as before."""
    settled = 0
    for name, fn in jit_functions(package).items():
        try:
            _ = fn.cache_key
        except Exception as err:  # hashed lazily at its first launch instead
            log.warning("cache key of %s not taken up front: %s: %s", name, type(err).__name__, err)
            continue
        settled += 1
    return settled
