"""Kernel manifests: the Triton kernel variants a dataplane compiled, as a file.

A fresh machine compiles every Triton kernel variant the warm-up reaches one
after another on the engine thread: 207-215 s of a Mixtral-8x7B start on the
H100 (benchmarks/NOTES.md, sessions 43-44). Each variant is fully described
by Triton's *specialization data* (argument types and their
specializations, constexprs, launch options, target), which Triton hands to
``knobs.runtime.jit_cache_hook`` and which ``JITFunction.preload`` compiles
from. A manifest is the list of those, written by one dataplane
(``DataplaneConfig.kernel_manifest_out``) and read by the next
(``kernel_manifest``), whose dataplane/kernel_precompile.py compiles them in
parallel threads of its process into Triton's caches before the warm-up, so
that the warm-up's launches find them instead of compiling.

A manifest never changes results: a variant it lacks is compiled by the
warm-up as before, and one that no longer matches the kernel source (a
renamed constexpr, another Triton or GPU) fails to preload and is skipped.

File format (JSON)::

    {"format": 1, "triton": "3.6.0",
     "variants": [{"module": "kernels.moe_fused", "qualname": "_moe_kernel",
                   "specialization": "<Triton's specialization data, a JSON string>"}, ...]}
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class KernelVariant:
    """One compiled variant: the ``@triton.jit`` function by import path,
    and Triton's specialization data for it."""

    module: str  # e.g. "kernels.moe_fused"
    qualname: str  # the JITFunction's name in that module
    specialization: str  # Triton's serialized specialization data (JSON text)


class VariantRecorder:
    """Collects the variants a dataplane compiles or loads (thread-safe: the
    hook runs on whichever thread launches); ``write`` saves them in first-seen
    order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._variants: dict[KernelVariant, None] = {}  # insertion-ordered set

    def add(self, variant: KernelVariant) -> None:
        with self._lock:
            self._variants.setdefault(variant, None)

    def variants(self) -> list[KernelVariant]:
        with self._lock:
            return list(self._variants)

    def write(self, path: str | Path) -> int:
        """Writes the manifest (atomically: a reader never sees half a file);
        returns the number of variants."""
        variants = self.variants()
        write_manifest(path, variants)
        return len(variants)


def write_manifest(path: str | Path, variants: list[KernelVariant]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "format": MANIFEST_FORMAT,
        "triton": _triton_version(),
        "variants": [{"module": v.module, "qualname": v.qualname, "specialization": v.specialization}
                     for v in variants],
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)


def read_manifest(path: str | Path) -> list[KernelVariant]:
    """The manifest's variants, without duplicates. Raises ValueError naming the
    file and the fault for a file that is not a manifest."""
    path = Path(path)
    try:
        body = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"kernel manifest {path}: cannot read it ({err.strerror or err})") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"kernel manifest {path}: not JSON ({err})") from err
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"kernel manifest {path}: expected an object with \"format\": {MANIFEST_FORMAT}")
    entries = body.get("variants")
    if not isinstance(entries, list):
        raise ValueError(f"kernel manifest {path}: \"variants\" must be a list")
    variants: dict[KernelVariant, None] = {}
    for i, entry in enumerate(entries):
        fields = (entry.get(k) if isinstance(entry, dict) else None for k in ("module", "qualname", "specialization"))
        module, qualname, specialization = fields
        if not all(isinstance(f, str) and f for f in (module, qualname, specialization)):
            raise ValueError(f"kernel manifest {path}: variant {i} needs non-empty strings "
                             "\"module\", \"qualname\" and \"specialization\"")
        variants.setdefault(KernelVariant(module, qualname, specialization), None)
    return list(variants)


def variant_from_hook(kwargs: dict) -> KernelVariant | None:
    """The variant of one ``jit_cache_hook`` call (its keyword arguments), or
    None when the call lacks what a preload needs (Triton versions without
    specialization data, a kernel not defined at a module's top level)."""
    jit_function = getattr(kwargs.get("fn"), "jit_function", None)
    fn = getattr(jit_function, "fn", None)
    specialization = (kwargs.get("compile") or {}).get("specialization_data")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not (isinstance(specialization, str) and module and qualname) or "<locals>" in qualname:
        return None
    return KernelVariant(module, qualname, specialization)


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__
