"""PagedExperts: one MoE layer's experts read through the WeightStore.

Two paths, the same function:
* plain torch (the reference; the CPU default): every expert block is read at
  its own committed bitwidth (gather pages -> field bytes -> decode with the
  view's scales -> matmul), so experts of one layer run at different bits in
  the same step;
* the fused Triton kernel (kernels/moe_mixed.py; the CUDA default): reads the
  arena through the store's device page table and ``block_fields`` in three
  launches, mixed bitwidths in one launch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dataplane.weights.layout import NUM_PROJ, PROJ_DOWN, PROJ_GATE, PROJ_UP, block_index
from dataplane.weights.store import WeightStore
from kernels.arrival_counters import ArrivalCounters
from kernels.moe_entry import moe_entry_suits
from kernels.moe_mixed import PagedWeights, fused_moe_from_residual, fused_moe_mixed
from kernels.moe_tuning import MoeTuning
from kernels.pdl import DEFAULT_PDL
from kernels.router import RoutingTargets


class PagedExperts(nn.Module):
    """Drop-in for DenseExperts (same forward) backed by paged multi-precision blocks.

    Block of (expert e, projection p) = block_index(layer, e, p, num_experts);
    gate/up blocks are [ffn, hidden], down blocks [hidden, ffn].
    """

    def __init__(
        self,
        store: WeightStore,
        layer: int,
        num_experts: int,
        hidden: int,
        ffn: int,
        *,
        cache_decoded: bool | None = None,
        fused_kernel: bool | None = None,
        counters: ArrivalCounters | None = None,
        accumulator_out: bool = False,
        fused_entry: bool = True,
        moe_tuning: MoeTuning | None = None,
    ) -> None:
        """counters: the fused kernel's zeroed arrival counters, shared by the
        layers of a model (quantize_experts passes one); None: this layer's own.
        accumulator_out: the fused path returns its float32 accumulator
        instead of rounding it to x's dtype in a launch of its own, for models
        that round it where they add it (dataplane/models/mixtral.py, whose
        RMSNorm.add_forward does). The plain path always returns x's dtype.
        fused_entry: with the fused kernel, also take the MoE block's entry
        over where kernels/moe_entry.py applies (ExpertsWithEntry).
        moe_tuning: the fused kernel's pipeline depths and register cap
        (kernels/moe_tuning.py; None: the measured defaults).
        The attribute ``pdl`` (kernels/pdl.py) says which of the fused
        kernel's launches take part in PDL; the model's use_pdl sets it."""
        super().__init__()
        self.store = store
        self.layer = layer
        self.num_experts = num_experts
        self.hidden_size = hidden
        self.ffn_size = ffn
        # Decoded weights are dense copies outside the arena's budget: cache them
        # only on the CPU (tests, reference runs) unless told otherwise.
        self.cache_decoded = store.device.type == "cpu" if cache_decoded is None else cache_decoded
        self.fused_kernel = store.device.type == "cuda" if fused_kernel is None else fused_kernel
        self.counters = ArrivalCounters() if counters is None else counters
        self.accumulator_out = accumulator_out
        self.fused_entry = fused_entry
        self.moe_tuning = moe_tuning
        self.pdl = DEFAULT_PDL
        want = {PROJ_GATE: (ffn, hidden), PROJ_UP: (ffn, hidden), PROJ_DOWN: (hidden, ffn)}
        for e in range(num_experts):
            for proj, shape in want.items():
                got = store.shape(self.block(e, proj))
                if got != shape:
                    raise ValueError(f"layer {layer} expert {e} proj {proj}: store block is {got}, expected {shape}")
        # block -> (bits, version, dtype, decoded weight [N, K]); stale entries are replaced on read
        self._cache: dict[int, tuple[int, int, torch.dtype, torch.Tensor]] = {}

    def block(self, expert: int, proj: int) -> int:
        return block_index(self.layer, expert, proj, self.num_experts)

    def weight(self, expert: int, proj: int, dtype: torch.dtype) -> torch.Tensor:
        """Decoded weight of one block at its committed bits: [N, K] in ``dtype``."""
        b = self.block(expert, proj)
        version = self.store.version(b)
        bits = self.store.bits(b)
        hit = self._cache.get(b)
        if hit is not None and hit[:3] == (bits, version, dtype):
            return hit[3]
        _, w = self.store.decode(b)
        w = w.to(dtype)
        if self.cache_decoded:
            self._cache[b] = (bits, version, dtype, w)
        return w

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """x [T, H], topk_ids [T, k] int64 (a router's top-k: distinct in a
        row, which the fused path's gate/up launch relies on), topk_weights
        [T, k] -> [T, H] in x's dtype (float32 from the fused path with
        accumulator_out).

        out[t] = sum_j topk_weights[t, j] * W2_e @ (silu(W1_e x_t) * (W3_e x_t)), e = topk_ids[t, j],
        each W at its block's committed bits.
        """
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"x must be [tokens, {self.hidden_size}], got {tuple(x.shape)}")
        if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
            raise ValueError(
                f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must be [tokens, k]"
            )
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            # Inside a CUDA-graph capture (dataplane/cuda_graphs.py): no host
            # work here. The graph runner polls the store before and records
            # the routed blocks' use after each replay (ModelRunner.touch_routed).
            return self._forward_fused(x, topk_ids, topk_weights)
        self.store.poll()  # commit promotions whose copies have landed
        if self.fused_kernel:
            # The kernels read every block through the page table, host-only
            # ones in place from the host: no host sync in this layer. The
            # runner records the routed blocks' use from the step's routing
            # counts (ModelRunner.touch_routed).
            return self._forward_fused(x, topk_ids, topk_weights)
        out = torch.zeros_like(x)  # [T, H]
        if x.shape[0] == 0:
            return out
        experts = torch.unique(topk_ids).tolist()
        if experts[0] < 0 or experts[-1] >= self.num_experts:
            raise ValueError(f"expert ids must be in [0, {self.num_experts}), got {experts[0]}..{experts[-1]}")
        # Recency only: the runner records the step's uses, host reads included (ModelRunner.touch_routed).
        self.store.recency.touch([self.block(e, p) for e in experts for p in range(NUM_PROJ)])
        # Host-only blocks are decoded from their host master (WeightStore.read_view).
        for e in experts:
            tok, pos = torch.where(topk_ids == e)  # [t_e], [t_e]
            xe = x[tok]  # [t_e, H]
            gate = xe @ self.weight(e, PROJ_GATE, x.dtype).T  # [t_e, F]
            up = xe @ self.weight(e, PROJ_UP, x.dtype).T  # [t_e, F]
            y = (F.silu(gate) * up) @ self.weight(e, PROJ_DOWN, x.dtype).T  # [t_e, H]
            out.index_add_(0, tok, (y * topk_weights[tok, pos].unsqueeze(-1)).to(x.dtype))
        return out

    def entry_ready(self, num_tokens: int, top_k: int, gate_weight: torch.Tensor) -> bool:
        """ExpertsWithEntry: the fused kernel and entry are on and
        kernels/moe_entry.py applies to these sizes (host-only blocks too: the
        kernels read them in place)."""
        if not (self.fused_kernel and self.fused_entry and moe_entry_suits(num_tokens, top_k, gate_weight)):
            return False
        if not (gate_weight.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.store.poll()  # commit promotions whose copies have landed
        return True

    def forward_from_residual(self, delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                              eps: float, gate_weight: torch.Tensor, top_k: int,
                              targets: RoutingTargets | None) -> tuple[torch.Tensor, torch.Tensor]:
        """ExpertsWithEntry, after entry_ready: (output [T, H], residual + delta),
        the output float32 with accumulator_out, else the residual's dtype."""
        out, res = fused_moe_from_residual(delta, residual, norm_weight, eps, gate_weight, top_k, self._paged_weights(),
                                           self.layer, self.num_experts, self.ffn_size, self.counters, targets,
                                           tuning=self.moe_tuning, pdl=self.pdl)
        return (out if self.accumulator_out else out.to(residual.dtype)), res

    def _paged_weights(self) -> PagedWeights:
        """The kernels' view of the store: arena storage, page table, block fields."""
        storage = self.store.arena.storage
        assert storage is not None
        return PagedWeights(storage, self.store.page_table, self.store.block_fields)

    def _forward_fused(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The fused kernel over the arena and, for host-only blocks, their host masters."""
        out = fused_moe_mixed(x, topk_ids, topk_weights, self._paged_weights(), self.layer, self.num_experts,
                              self.ffn_size, counters=self.counters, tuning=self.moe_tuning,
                              pdl=self.pdl, distinct_ids=True)  # [T, H] float32 (a router's top-k)
        return out if self.accumulator_out else out.to(x.dtype)
