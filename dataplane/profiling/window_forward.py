"""Whole-window forward passes of a dataplane model (offline evaluation).

A window is one prefill of ``seq_len`` tokens starting at position 0. A batch
of windows runs as one flattened step of independent sequences through the
model's own paged-attention path, over a private KV arena sized for one batch
(the serving engine is not involved: no scheduler, no sampling).
"""

from __future__ import annotations

import torch
from torch import nn

from dataplane.kv_cache import KVCacheManager, blocks_for_tokens, kv_block_bytes
from dataplane.memory.arena import Arena
from dataplane.models.mixtral import MixtralSpec
from dataplane.routing_stats import RoutingStats
from dataplane.runner import ModelRunner
from dataplane.sampler import Sampler
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler import ScheduledSeq
from dataplane.sequence import Sequence

KV_BLOCK_SIZE = 64  # tokens per KV block; windows are long prefills, so large blocks


class WindowForward:
    """Runs ``model`` (a dataplane causal LM: forward(ids, positions, ctx) and
    compute_logits(hidden)) on batches of windows [B, S] with B <= max_batch."""

    def __init__(self, model: nn.Module, spec: MixtralSpec, max_batch: int, seq_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if max_batch <= 0 or seq_len <= 0:
            raise ValueError(f"max_batch and seq_len must be positive, got {max_batch}, {seq_len}")
        self.model = model
        self.spec = spec
        self.max_batch = max_batch
        self.seq_len = seq_len
        self.device = torch.device(device)
        page = kv_block_bytes(KV_BLOCK_SIZE, spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)
        pages = max_batch * blocks_for_tokens(seq_len, KV_BLOCK_SIZE)
        self.kv = KVCacheManager(Arena(pages, page, self.device), KV_BLOCK_SIZE, spec.num_layers,
                                 spec.num_kv_heads, spec.head_dim, dtype)
        self._runner = ModelRunner(model, self.kv, spec.num_layers, spec.num_experts, self.device,
                                   spec.sliding_window, Sampler())

    @torch.inference_mode()
    def hidden(self, windows: torch.Tensor) -> tuple[torch.Tensor, RoutingStats]:
        """windows: [B, S] int64 -> (final hidden states [B, S, H], the step's routing)."""
        if windows.dim() != 2 or not 0 < windows.shape[0] <= self.max_batch or windows.shape[1] > self.seq_len:
            raise ValueError(
                f"windows must be [1..{self.max_batch}, <= {self.seq_len}], got {tuple(windows.shape)}"
            )
        batch, length = windows.shape
        scheduled = []
        for i, row in enumerate(windows.tolist()):
            seq = Sequence(f"window-{i}", row, SamplingParams(), arrival=i)
            self.kv.allocate(seq.seq_id, length)
            scheduled.append(ScheduledSeq(seq, 0, length))
        try:
            input_ids, positions, ctx = self._runner.prepare(scheduled)
            hidden = self.model(input_ids, positions, ctx)  # [B * S, H]
        finally:
            for item in scheduled:
                self.kv.free(item.seq.seq_id)
        assert ctx.routing is not None
        return hidden.view(batch, length, -1), ctx.routing

    @torch.inference_mode()
    def log_probs(self, windows: torch.Tensor) -> torch.Tensor:
        """windows: [B, S] -> next-token log-probabilities [B, S, vocab] float32."""
        hidden, _ = self.hidden(windows)
        logits = self.model.compute_logits(hidden.flatten(0, 1))  # [B * S, V]
        return torch.log_softmax(logits, dim=-1).view(*windows.shape, -1)
