"""Host pages for the weight store's master copies.

On a GPU the masters live in pinned memory so promotions can copy them
asynchronously. They are carved from slabs (doubling up to 1 GiB), so a
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
"""

from __future__ import annotations

import weakref

import torch

MIB = 1 << 20
FIRST_SLAB_BYTES = 64 * MIB  # small models stay small
MAX_SLAB_BYTES = 1024 * MIB  # slabs double up to this size


class HostPagePool:
    """Hands out zero-initialised ``[n, page_bytes]`` uint8 host tensors.

    ``slabs`` (default: when pinning) carves requests from power-of-two
    slabs; without it each request is its own buffer (pageable memory has no
    rounding). Views stay valid as long as the pool or the views live.
    """

    def __init__(self, page_bytes: int, pin: bool, slabs: bool | None = None) -> None:
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be positive, got {page_bytes}")
        self.page_bytes = page_bytes
        self.pin = pin
        self.slabs = pin if slabs is None else slabs
        self._slab: torch.Tensor | None = None  # [pages, page_bytes] uint8, current slab
        self._used = 0  # pages of the current slab handed out
        self._next_slab_bytes = FIRST_SLAB_BYTES
        self.allocated_bytes = 0  # host bytes allocated (slabs or single buffers)
        # Page-locked buffers, unregistered when the pool goes (views that
        # outlive it stay valid, as pageable memory).
        self._registered: list[torch.Tensor] = []
        weakref.finalize(self, _unregister_all, self._registered)

    def take(self, num_pages: int) -> torch.Tensor:
        """A zeroed [num_pages, page_bytes] uint8 tensor (pinned when the pool pins)."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if not self.slabs:
            self.allocated_bytes += num_pages * self.page_bytes
            return self._zeros(num_pages)
        if self._slab is None or self._used + num_pages > self._slab.shape[0]:
            self._new_slab(num_pages)
        assert self._slab is not None
        view = self._slab[self._used : self._used + num_pages]
        self._used += num_pages
        return view

    def _new_slab(self, at_least_pages: int) -> None:
        size = max(self._next_slab_bytes, self.page_bytes)
        while size < at_least_pages * self.page_bytes:
            size *= 2
        pages = size // self.page_bytes
        self._slab = self._zeros(pages)
        self._used = 0
        self.allocated_bytes += pages * self.page_bytes
        self._next_slab_bytes = min(self._next_slab_bytes * 2, MAX_SLAB_BYTES)

    def _zeros(self, pages: int) -> torch.Tensor:
        """Zeroed uint8 [pages, page_bytes] host memory, page-locked when the pool pins."""
        buf = torch.zeros(pages, self.page_bytes, dtype=torch.uint8)
        if self.pin:
            err = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 0))
            if err:
                raise RuntimeError(f"cudaHostRegister of {buf.numel()} host bytes failed (cudaError {err})")
            self._registered.append(buf)
        return buf


def _unregister_all(buffers: list[torch.Tensor]) -> None:
    """Page-locked buffers back to pageable. Errors are ignored: at interpreter
    exit the CUDA runtime may already be gone (and the memory with the process)."""
    for buf in buffers:
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
    buffers.clear()
