"""Give back the L1 cache that Triton's loader takes from kernels over 48 KiB
of shared memory.

Triton loads a kernel that needs more than 48 KiB of dynamic shared memory
with the shared-memory carveout at its maximum (CU_FUNC_CACHE_PREFER_SHARED:
228 KiB shared, ~28 KiB L1 on the H200). The MoE weight kernels hold 2
programs per multiprocessor whatever the carveout (255 registers per
thread), so the extra shared memory is unused while L1 (register spills,
scale and activation-sum loads) shrinks. Measured: the wide-tile build of
the MoE launches (58.5 KiB) ran its 16-token steps 8-14 % slower than the
46 KiB build with identical loops, with more long-scoreboard stalls
(benchmarks/results/moe_ncu_wide_h200.json); limiting the carveout took the
Mixtral B=64 4-bit layer from 404.9 to 385.3 us (46 KiB build: 358.8;
moe_carveout_rr_h200.json). The rest was code order (kernels/moe_gate_up.py, moe_down.py).

limit_carveout() asks the driver for the smallest carveout that still holds
`programs` programs (a hint; the driver rounds up to a supported size).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math

import torch

log = logging.getLogger(__name__)

# CUfunction_attribute and CUfunc_cache values from cuda.h.
_CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
_CU_FUNC_CACHE_PREFER_NONE = 0
# Triton switches to the maximum carveout above this (the static limit).
TRITON_SHARED_THRESHOLD = 48 * 1024
# Shared memory the driver reserves per resident block on sm_80 and later.
RESERVED_SHARED_PER_BLOCK = 1024


def carveout_percent(shared_bytes: int, programs: int, smem_per_sm: int) -> int:
    """Percent of the multiprocessor's shared capacity that holds `programs`
    blocks of `shared_bytes` each (rounded up; 100 when they do not fit)."""
    if shared_bytes < 0 or programs < 1 or smem_per_sm <= 0:
        raise ValueError("shared_bytes >= 0, programs >= 1 and smem_per_sm > 0 required")
    need = programs * (shared_bytes + RESERVED_SHARED_PER_BLOCK)
    return min(100, math.ceil(100 * need / smem_per_sm))


@functools.cache
def _libcuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.cuFuncSetCacheConfig.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
    return lib


def carveout_of(function: int) -> int:
    """The carveout preference (percent, -1 = none) of a loaded CUfunction."""
    value = ctypes.c_int()
    status = _libcuda().cuFuncGetAttribute(ctypes.byref(value), _CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                           ctypes.c_void_p(function))
    if status != 0:
        raise RuntimeError(f"reading the shared-memory carveout failed: CUresult {status}")
    return value.value


def limit_carveout(kernel, programs: int, smem_per_sm: int) -> bool:
    """Set the carveout of a loaded Triton kernel (the object a launch returns)
    to what `programs` resident programs need. Returns False (and changes
    nothing) for kernels at or under the 48 KiB threshold, whose carveout the
    driver already sizes. Raises RuntimeError when the driver refuses."""
    shared = int(kernel.metadata.shared)
    if shared <= TRITON_SHARED_THRESHOLD:
        return False
    lib = _libcuda()
    function = ctypes.c_void_p(kernel.function)
    status = lib.cuFuncSetCacheConfig(function, _CU_FUNC_CACHE_PREFER_NONE)
    if status == 0:
        status = lib.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                        carveout_percent(shared, programs, smem_per_sm))
    if status != 0:
        raise RuntimeError(f"setting the shared-memory carveout failed: CUresult {status}")
    return True


def limit_carveout_once(kernel, done: set[int], programs: int, device: torch.device) -> None:
    """limit_carveout for a kernel a launch returned, unless its CUfunction is
    in `done` (the caller's record; the first launch ran with Triton's
    carveout). Nothing happens for launches that return no loaded kernel
    (the interpreter) or on ROCm. The carveout is a speed hint: when the
    driver refuses it the kernel keeps Triton's and a warning is logged."""
    function = getattr(kernel, "function", None)
    if function is None or function in done or torch.version.hip is not None:
        return
    done.add(function)
    smem = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    try:
        limit_carveout(kernel, programs, smem)
    except (OSError, RuntimeError) as exc:
        log.warning("kept Triton's shared-memory carveout for %s: %s", getattr(kernel, "name", "a kernel"), exc)
