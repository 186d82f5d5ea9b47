"""Everything one forward step needs besides the token ids and positions.

Passed explicitly down the model (never stored globally): the attention
layout, each layer's KV cache views, and the step's routing recorder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.layers.attention import AttentionMetadata
from dataplane.routing_stats import RoutingStats


@dataclass
class ForwardContext:
    """Per-step inputs shared by all layers."""

    attn: AttentionMetadata
    # Per decoder layer: (k_cache, v_cache), each [num_blocks, block_size, kv_heads, head_dim].
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    # Filled by the MoE blocks; None when routing is not recorded.
    routing: RoutingStats | None = None
    # The whole cache as [pages, layers, 2, block_size, kv_heads, head_dim]
    # (KVCacheManager.cache_view) when decode steps may use the Triton
    # kernels (CUDA); None keeps the plain-torch attention.
    kv_arena: torch.Tensor | None = None
