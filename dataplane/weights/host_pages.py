"""Host pages for the weight store's master copies.

On a GPU the masters live in pinned memory so promotions can copy them
asynchronously and the MoE kernels can read a host-only block in place
(zero-copy over PCIe: registered host memory is mapped into the device's
address space). They are carved from slabs (doubling up to 1 GiB), so a
model's ~54 GB of masters (Mixtral-8x7B) take about fifty page-lockings,
not one per field, and the waste is the unused tail of the current slab only.
(Slabs began as a guard against torch's pinned allocator, which rounds every
allocation up to a power of two; the pool no longer uses it.)

A pinned slab is not torch's pinned allocation (``cudaHostAlloc``) but
pageable zeros that torch's CPU threads first touch in parallel, page-locked
afterwards with ``cudaHostRegister``. Measured on the H200 machine
(benchmarks/build_phases.py): a fresh 1 GiB slab took 0.98 s by
``torch.zeros(pin_memory=True)`` and 0.37 s registered, and device-to-host
copies into it ran at 44.8 and 52.3 GB/s
(benchmarks/results/build_phases_s18_slabs_h200.json). In the synthetic
Mixtral-8x7B build the slabs had taken ~0.76 s per GiB, ~38 of its 58 s
by their count (build_phases_s18_h200.json); registered, the build took 27-33 s.

Page addresses: every buffer the pool hands out starts at a device address
congruent to ``align_to`` modulo ``page_bytes`` (one spare page per buffer
pays for it), so that a host page sits a whole number of pages from the
arena's base and the weight store's page table can name it as a (signed)
page offset from that base (docs/WEIGHT_LAYOUT.md, "Host pages").
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import torch

MIB = 1 << 20
FIRST_SLAB_BYTES = 64 * MIB  # small models stay small
MAX_SLAB_BYTES = 1024 * MIB  # slabs double up to this size
CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3  # CUpointer_attribute (cuda.h)


def mapped_device_address(host_address: int) -> int:
    """The device address of registered host memory (the driver's
    ``cuPointerGetAttribute``); with unified addressing it is usually the
    host address itself, but the driver is the one that knows."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    out = ctypes.c_uint64()
    err = libcuda.cuPointerGetAttribute(ctypes.byref(out), CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                        ctypes.c_uint64(host_address))
    if err:
        raise RuntimeError(f"cuPointerGetAttribute(DEVICE_POINTER) failed (CUresult {err})")
    return int(out.value)


@dataclass(frozen=True)
class _Buffer:
    memory: torch.Tensor  # uint8 [nbytes], held for the pool's life (page_offset's records stay true)
    device: int  # the address device code reads its first byte at

    @property
    def host(self) -> int:
        return self.memory.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.memory.numel()


class HostPagePool:
    """Hands out zero-initialised ``[n, page_bytes]`` uint8 host tensors.

    ``slabs`` (default: when pinning) carves requests from power-of-two
    slabs; without it each request is its own buffer (pageable memory has no
    rounding). Views stay valid as long as the pool or the views live.
    ``align_to``: the device address every buffer is aligned to modulo
    page_bytes (the arena's base), so ``page_offset`` is whole.
    """

    def __init__(self, page_bytes: int, pin: bool, slabs: bool | None = None, align_to: int = 0) -> None:
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be positive, got {page_bytes}")
        self.page_bytes = page_bytes
        self.pin = pin
        self.slabs = pin if slabs is None else slabs
        self.align_to = align_to
        self._slab: torch.Tensor | None = None  # [pages, page_bytes] uint8, current slab
        self._used = 0  # pages of the current slab handed out
        self._next_slab_bytes = FIRST_SLAB_BYTES
        self.allocated_bytes = 0  # host bytes allocated (slabs or single buffers)
        self._buffers: list[_Buffer] = []  # every buffer handed out from, for page_offset
        # Page-locked buffers, unregistered when the pool goes (views that
        # outlive it stay valid, as pageable memory).
        self._registered: list[torch.Tensor] = []
        weakref.finalize(self, _unregister_all, self._registered)

    def take(self, num_pages: int) -> torch.Tensor:
        """A zeroed [num_pages, page_bytes] uint8 tensor (pinned when the pool pins)."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if not self.slabs:
            return self._zeros(num_pages)
        if self._slab is None or self._used + num_pages > self._slab.shape[0]:
            self._new_slab(num_pages)
        assert self._slab is not None
        view = self._slab[self._used : self._used + num_pages]
        self._used += num_pages
        return view

    def page_offset(self, pages: torch.Tensor) -> int:
        """Pages from ``align_to`` to the first page of ``pages`` (a tensor
        this pool handed out), at the address device code reads it at."""
        addr = pages.data_ptr()
        for buf in self._buffers:
            if buf.host <= addr < buf.host + buf.nbytes:
                delta = buf.device + (addr - buf.host) - self.align_to
                assert delta % self.page_bytes == 0, "pool buffers are page-aligned to align_to"
                return delta // self.page_bytes
        raise ValueError("these pages were not handed out by this pool")

    def _new_slab(self, at_least_pages: int) -> None:
        size = max(self._next_slab_bytes, self.page_bytes)
        while size < at_least_pages * self.page_bytes:
            size *= 2
        self._slab = self._zeros(size // self.page_bytes)
        self._used = 0
        self._next_slab_bytes = min(self._next_slab_bytes * 2, MAX_SLAB_BYTES)

    def _zeros(self, pages: int) -> torch.Tensor:
        """Zeroed uint8 [pages, page_bytes] host memory, page-locked when the
        pool pins, starting at a device address congruent to align_to."""
        nbytes = (pages + 1) * self.page_bytes  # a spare page to align within
        flat = torch.zeros(nbytes, dtype=torch.uint8)
        device = flat.data_ptr()
        if self.pin:
            err = int(torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), nbytes, 0))
            if err:
                raise RuntimeError(f"cudaHostRegister of {nbytes} host bytes failed (cudaError {err})")
            self._registered.append(flat)
            device = mapped_device_address(flat.data_ptr())
        self.allocated_bytes += nbytes
        self._buffers.append(_Buffer(flat, device))
        skip = (self.align_to - device) % self.page_bytes
        return flat[skip : skip + pages * self.page_bytes].view(pages, self.page_bytes)


def _unregister_all(buffers: list[torch.Tensor]) -> None:
    """Page-locked buffers back to pageable. Errors are ignored: at interpreter
    exit the CUDA runtime may already be gone (and the memory with the process)."""
    for buf in buffers:
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
    buffers.clear()
