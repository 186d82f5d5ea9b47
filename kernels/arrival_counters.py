"""Zeroed int32 counters that launches borrow and hand back zeroed.

The fused MoE gate/up launch pairs its programs through arrival counters
(kernels/moe_gate_up.py): the second program of a pair combines SiLU(gate) *
up and resets the counter to zero before it ends. Allocating the counters per
call meant a zero fill per layer (0.9 us of a ~127 us layer in the B=1
profile, benchmarks/results/e2e_h200_s15_b1_profile.json), although every
launch leaves them zero. One buffer, zeroed once, serves every layer and
step instead.

Contract of a borrower: it uses the view in stream order on one stream, and
its launch leaves every element it touched at zero (the gate/up launch does:
both programs of a pair run or both skip). Views of one buffer overlap, so
two launches may not hold them at once on different streams.

Not thread-safe: the engine thread alone runs the model.
"""

from __future__ import annotations

import math

import torch


class ArrivalCounters:
    """A grow-on-demand zeroed int32 buffer per device (see the module docstring)."""

    def __init__(self) -> None:
        # device -> every buffer allocated for it, newest last. Older, smaller
        # buffers stay alive: CUDA graphs captured while they were the newest
        # still read them at replay.
        self._buffers: dict[torch.device, list[torch.Tensor]] = {}

    def take(self, shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
        """A zeroed int32 view of ``shape`` (contiguous) on ``device``.

        Grows the buffer when it is too small, except during CUDA-graph
        capture (a new buffer allocated there would live in the graph's memory
        pool): then the capture gets a fresh zeroed tensor, filled by a launch
        of its own, as if there were no shared buffer. The eager warm-up
        before a capture grows the buffer to the size the capture needs.
        """
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # one key for "cuda" and "cuda:0"
        if any(n < 0 for n in shape):
            raise ValueError(f"negative size in {shape}")
        numel = math.prod(shape)
        buffers = self._buffers.setdefault(device, [])
        if not buffers or buffers[-1].numel() < numel:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return torch.zeros(shape, dtype=torch.int32, device=device)
            buffers.append(torch.zeros(max(numel, 1), dtype=torch.int32, device=device))
        return buffers[-1][:numel].view(shape)

    def all_zero(self) -> bool:
        """Whether every buffer held is zero, as borrowers must leave them (a host sync)."""
        return all(int(b.count_nonzero()) == 0 for bufs in self._buffers.values() for b in bufs)

    def allocated_bytes(self) -> int:
        """Bytes of every buffer held (all devices)."""
        return sum(b.numel() * b.element_size() for bufs in self._buffers.values() for b in bufs)
