"""Routing statistics: what the router did, per layer and expert.

Three objects, from the hot path outwards:

* ``RoutingStats`` — filled by the MoE blocks during ONE forward step (it is
  handed to them in the forward context, never through global state). Device
  tensors, no host syncs.
* ``RoutingWindow`` — host-side sums over the steps since the last telemetry
  report (``drain`` returns and resets them).
* ``DemandTracker`` — per running sequence, an exponentially decayed mean of
  its tokens' routing distributions; the sum over running sequences is the
  ``running_demand`` of telemetry.proto.

The engine thread owns all three; ``RoutingWindow`` and ``DemandTracker`` are
read by the telemetry thread, so they lock.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from kernels.router import RoutingTargets


_INT64_BYTES, _FLOAT32_BYTES = 8, 4
# Each sum of RoutingStats' buffer starts at a multiple of this, so that the
# kernels that add into them see 16-byte aligned rows where the sizes allow.
_SECTION_ALIGN = 16


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _SECTION_ALIGN) * _SECTION_ALIGN


def _buffer_layout(num_layers: int, num_experts: int, num_seqs: int) -> tuple[int, int, int]:
    """(byte offset of prob_mass, of seq_prob_sum, total bytes) in RoutingStats'
    buffer; routed_tokens starts at 0."""
    cells = num_layers * num_experts
    mass_at = _aligned(cells * _INT64_BYTES)
    seq_at = mass_at + _aligned(cells * _FLOAT32_BYTES)
    return mass_at, seq_at, seq_at + num_seqs * cells * _FLOAT32_BYTES


class RoutingStats:
    """Routing of one forward step, per layer and expert (device tensors).

    ``token_weight`` ([T] int64 of 0/1, optional) excludes padding rows (a
    CUDA-graph batch padded to its captured size) from every sum. ``record``
    has no host sync and allocates nothing that depends on the data, so it can
    be captured in a CUDA graph.
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        token_seq_index: torch.Tensor,
        num_seqs: int,
        token_weight: torch.Tensor | None = None,
    ) -> None:
        # token_seq_index: [T] int64, the batch index of each token's sequence
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.num_seqs = num_seqs
        self.token_seq_index = token_seq_index
        self.token_weight = token_weight
        # The three sums are views of one buffer: a step zeroes them with one
        # fill and a graph step's host copy is one copy, not three (each a
        # launch on the decode step's chain).
        self.buffer = torch.zeros(_buffer_layout(num_layers, num_experts, num_seqs)[2], dtype=torch.uint8,
                                  device=token_seq_index.device)
        self.routed_tokens, self.prob_mass, self.seq_prob_sum = self.views(self.buffer)

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(routed_tokens, prob_mass, seq_prob_sum) as views of ``buffer`` (this
        recorder's or a copy of it, e.g. on the host):
        * routed_tokens [layers, experts] int64: tokens routed to each expert
          (a token counts once per chosen expert);
        * prob_mass [layers, experts] float32: the sum over tokens of the
          router's softmax probability;
        * seq_prob_sum [B, layers, experts] float32: the same sum split by sequence.
        """
        cells = self.num_layers * self.num_experts
        mass_at, seq_at, end = _buffer_layout(self.num_layers, self.num_experts, self.num_seqs)
        routed = buffer[:cells * _INT64_BYTES].view(torch.int64).view(self.num_layers, self.num_experts)
        mass = buffer[mass_at:mass_at + cells * _FLOAT32_BYTES].view(torch.float32)
        seq = buffer[seq_at:end].view(torch.float32)
        return (routed, mass.view(self.num_layers, self.num_experts),
                seq.view(self.num_seqs, self.num_layers, self.num_experts))

    def reset(self) -> None:
        """Zeroes the sums in place (a captured graph reuses one recorder)."""
        self.buffer.zero_()

    def targets(self, layer: int) -> RoutingTargets:
        """Views of one layer's sums, for the fused router kernel (kernels/router.py)."""
        return RoutingTargets(
            routed=self.routed_tokens[layer],
            mass=self.prob_mass[layer],
            seq_mass=self.seq_prob_sum[:, layer],
            token_seq=self.token_seq_index,
            token_weight=self.token_weight,
        )

    def record(self, layer: int, topk_ids: torch.Tensor, probs: torch.Tensor) -> None:
        """Adds one MoE layer's routing. topk_ids: [T, k] int64; probs: [T, E] float32."""
        if self.token_weight is None:
            counts = torch.ones_like(topk_ids)  # [T, k]
        else:
            counts = self.token_weight[:, None].expand_as(topk_ids)  # [T, k]
            probs = probs * self.token_weight[:, None].to(probs.dtype)
        # scatter_add, not bincount: bincount syncs with the host to size its output.
        self.routed_tokens[layer].scatter_add_(0, topk_ids.reshape(-1), counts.reshape(-1))
        self.prob_mass[layer] += probs.sum(dim=0)
        self.seq_prob_sum[:, layer].index_add_(0, self.token_seq_index, probs)


class RoutingWindow:
    """Routing sums since the last ``drain`` (host tensors, thread-safe)."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self._lock = threading.Lock()
        self._routed = torch.zeros(num_layers, num_experts, dtype=torch.int64)
        self._mass = torch.zeros(num_layers, num_experts, dtype=torch.float64)

    def add(self, routed_tokens: torch.Tensor, prob_mass: torch.Tensor) -> None:
        """routed_tokens, prob_mass: [layers, experts] host tensors of one step."""
        with self._lock:
            self._routed += routed_tokens
            self._mass += prob_mass.double()

    def drain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (routed_tokens int64, prob_mass float64), [layers, experts], and resets."""
        with self._lock:
            routed, mass = self._routed.clone(), self._mass.clone()
            self._routed.zero_()
            self._mass.zero_()
        return routed, mass


class DemandTracker:
    """Decayed mean routing distribution per running sequence.

    After a step in which a sequence computed ``n`` tokens whose router
    probabilities sum to ``S`` ([layers, experts]), its mean becomes
    ``decay^n * mean + (1 - decay^n) * S / n``: each token weighs as one
    observation of an exponential moving average with factor ``decay``.

    The means live in one numpy table, a row per tracked sequence, so a step
    costs the same few array ops whatever the batch (per-sequence torch ops
    took about 1.2 ms of host time per step at B = 64); rows of forgotten
    sequences are zero and reused.
    """

    def __init__(self, num_layers: int, num_experts: int, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self._lock = threading.Lock()
        self._shape = (num_layers, num_experts)
        self._decay = decay
        self._rows: dict[str, int] = {}  # seq_id -> row of _means
        self._free_rows: list[int] = []
        # numpy, not torch: at these sizes (a few KB) its per-call cost is a
        # few microseconds, torch's several times more.
        self._means = np.zeros((0, num_layers, num_experts), dtype=np.float32)  # [rows, layers, experts]

    def update(self, seq_ids: list[str], seq_prob_sum: torch.Tensor, num_tokens: list[int]) -> None:
        """seq_prob_sum: [B, layers, experts] host tensor, row i for seq_ids[i]."""
        picked: list[int] = []  # batch rows that computed tokens
        rows: list[int] = []
        keep: list[float] = []  # weight of the old mean (0 for a new sequence)
        take: list[float] = []  # weight of S: (1 - keep) / n
        with self._lock:
            for i, seq_id in enumerate(seq_ids):
                n = num_tokens[i]
                if n <= 0:
                    continue
                row = self._rows.get(seq_id)
                old_weight = 0.0 if row is None else self._decay**n
                if row is None:
                    row = self._new_row(seq_id)
                picked.append(i)
                rows.append(row)
                keep.append(old_weight)
                take.append((1.0 - old_weight) / n)
            if not rows:
                return
            sums = seq_prob_sum.numpy()  # [B, layers, experts], no copy
            step = sums if len(picked) == len(seq_ids) else sums[picked]  # [b, layers, experts]
            weights = np.array([keep, take], dtype=np.float32)[:, :, None, None]  # [2, b, 1, 1]
            self._means[rows] = self._means[rows] * weights[0] + step * weights[1]

    def _new_row(self, seq_id: str) -> int:
        if not self._free_rows:
            grown = max(1, 2 * self._means.shape[0])
            self._free_rows.extend(range(grown - 1, self._means.shape[0] - 1, -1))
            table = np.zeros((grown, *self._shape), dtype=np.float32)
            table[: self._means.shape[0]] = self._means
            self._means = table
        row = self._free_rows.pop()
        self._rows[seq_id] = row
        return row

    def remove(self, seq_id: str) -> None:
        """Forgets a sequence (finished, aborted or preempted)."""
        with self._lock:
            row = self._rows.pop(seq_id, None)
            if row is not None:
                self._means[row] = 0.0
                self._free_rows.append(row)

    def running_demand(self) -> torch.Tensor:
        """Sum of the tracked sequences' means: [layers, experts] float32."""
        with self._lock:
            return torch.from_numpy(self._means.sum(axis=0))

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)
