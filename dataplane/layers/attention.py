"""Paged KV attention in plain torch (the reference semantics).

Batch layout (flattened, vLLM style): the step's new tokens of all sequences
are concatenated, sequence after sequence, into ``T`` rows. Sequence ``i``
owns rows ``query_start_loc[i] : query_start_loc[i + 1]``; those are its last
``query_len`` tokens, and after this step it has ``context_lens[i]`` tokens in
the cache (its earlier tokens plus these). A decode is a sequence with one new
token; a prefill (or a chunk of one) has more. Both may share a step.

KV cache of one layer: ``k_cache`` and ``v_cache``, each
``[num_blocks, block_size, kv_heads, head_dim]``. They are strided views of the
arena (page stride != block_size * kv_heads * head_dim), so kernels must use
the tensors' strides. Token ``j`` of a sequence lives in block
``block_tables[i, j // block_size]`` at offset ``j % block_size``; its flat
slot is ``block * block_size + offset``. ``block_tables`` rows are padded with
0 past the sequence's blocks: only ``context_lens`` says what is valid.

A Triton kernel replacing ``paged_decode_attention`` must keep its signature
and semantics; ``write_kv`` and ``paged_prefill_attention`` likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from kernels.paged_attention import paged_attention_decode
from kernels.pdl import DEFAULT_PDL, PdlPolicy


@dataclass
class AttentionMetadata:
    """Where the step's tokens sit in the batch and in the KV cache."""

    slot_mapping: torch.Tensor  # [T] int64: flat KV slot of each new token
    query_start_loc: torch.Tensor  # [B + 1] int32: row offsets of sequences
    context_lens: torch.Tensor  # [B] int32: cached tokens after this step
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    # Host copies of the lengths: the torch path loops over sequences, and
    # reading them from the device would sync once per layer.
    query_lens_host: list[int]
    context_lens_host: list[int]
    block_size: int
    sliding_window: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_host)

    @property
    def decode_only(self) -> bool:
        """Every sequence has exactly one new token this step."""
        return all(n == 1 for n in self.query_lens_host)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Stores the new tokens' keys and values in their slots, in place.

    k, v: [T, kv_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    kv_heads, head_dim]; slot_mapping: [T] int64.
    """
    block_size = k_cache.shape[1]
    blocks = slot_mapping // block_size  # [T]
    offsets = slot_mapping % block_size  # [T]
    # Two index tensors instead of a flat view: the cache is not contiguous
    # across blocks, so a reshape would copy and the write would be lost.
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached context.

    q: [B, heads, head_dim]; block_tables: [B, max_blocks] int32 (only the
    first ceil(context_len / block_size) entries of a row are read);
    context_lens: [B] int32 >= 1 (the new token is the last cached one).
    Returns [B, heads, head_dim] in q's dtype. GQA: query head h reads
    kv head h // (heads // kv_heads).
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = block_tables.shape[1] * block_size
    tables = block_tables.long()
    keys = k_cache[tables].reshape(num_seqs, max_len, num_kv_heads, head_dim)  # [B, L, kvh, D]
    values = v_cache[tables].reshape(num_seqs, max_len, num_kv_heads, head_dim)
    qg = q.reshape(num_seqs, num_kv_heads, group, head_dim).float()  # [B, kvh, G, D]
    scores = torch.einsum("bkgd,blkd->bkgl", qg, keys.float()) * scale  # [B, kvh, G, L]
    key_pos = torch.arange(max_len, device=q.device)[None, :]  # [1, L]
    lens = context_lens.long()[:, None]  # [B, 1]
    valid = key_pos < lens  # [B, L]
    if sliding_window is not None:
        valid &= key_pos > lens - 1 - sliding_window
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    # Slots past a sequence's length hold stale bytes (maybe NaN): 0 * NaN is
    # NaN, so zero them rather than rely on zero probabilities.
    values = values.float().masked_fill(~valid[:, :, None, None], 0.0)
    out = torch.einsum("bkgl,blkd->bkgd", probs, values)  # [B, kvh, G, D]
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of one sequence's last ``q_len`` tokens.

    q: [q_len, heads, head_dim], the tokens at positions context_len - q_len
    .. context_len - 1, whose K/V are already written; block_table: [>=
    ceil(context_len / block_size)] int32. Returns [q_len, heads, head_dim].

    Without a sliding window the mask is torch's lower-right causal bias (query
    i sees keys up to context_len - q_len + i, so a cached prefix is seen whole),
    which SDPA runs as a fused kernel (flash or memory-efficient) where the
    device has one, instead of materialising [q_len, context_len] scores.
    K/V heads are repeated to the query heads for that path: the bias's fused
    branches (torch/nn/attention/bias.py) call the flash and memory-efficient
    ops without a grouped-head flag.
    """
    q_len, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_blocks = -(-context_len // block_size)
    blocks = block_table[:num_blocks].long()
    keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]  # [ctx, kvh, D]
    values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]
    if sliding_window is None:
        group = num_heads // num_kv_heads
        keys = keys.to(q.dtype).repeat_interleave(group, dim=1)  # [ctx, heads, D]
        values = values.to(q.dtype).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # [1, heads, q_len, D]
            keys.transpose(0, 1)[None],  # [1, heads, ctx, D]
            values.transpose(0, 1)[None],
            attn_mask=causal_lower_right(q_len, context_len),
            scale=scale,
        )  # [1, heads, q_len, D]
        return out[0].transpose(0, 1)
    q_pos = torch.arange(context_len - q_len, context_len, device=q.device)[:, None]  # [q_len, 1]
    k_pos = torch.arange(context_len, device=q.device)[None, :]  # [1, ctx]
    allowed = (k_pos <= q_pos) & (k_pos > q_pos - sliding_window)  # [q_len, ctx]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # [1, heads, q_len, D]
        keys.to(q.dtype).transpose(0, 1)[None],  # [1, kvh, ctx, D]
        values.to(q.dtype).transpose(0, 1)[None],
        attn_mask=allowed,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # [1, heads, q_len, D]
    return out[0].transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention for a mixed batch: decodes together, prefills one by one.

    q: [T, heads, head_dim] laid out as described in the module docstring;
    the step's K/V must already be written. Returns [T, heads, head_dim].
    """
    out = torch.empty_like(q)
    starts = [0]
    for n in meta.query_lens_host:
        starts.append(starts[-1] + n)
    decode_seqs = [i for i, n in enumerate(meta.query_lens_host) if n == 1]
    if decode_seqs:
        max_ctx = max(meta.context_lens_host[i] for i in decode_seqs)
        max_blocks = -(-max_ctx // meta.block_size)
        idx = torch.tensor(decode_seqs, device=q.device)
        rows = torch.tensor([starts[i] for i in decode_seqs], device=q.device)
        out[rows] = paged_decode_attention(
            q[rows],
            k_cache,
            v_cache,
            meta.block_tables[idx, :max_blocks],
            meta.context_lens[idx],
            scale,
            meta.sliding_window,
        )
    for i, q_len in enumerate(meta.query_lens_host):
        if q_len == 1:
            continue
        start = starts[i]
        out[start : start + q_len] = paged_prefill_attention(
            q[start : start + q_len],
            k_cache,
            v_cache,
            meta.block_tables[i],
            meta.context_lens_host[i],
            scale,
            meta.sliding_window,
        )
    return out


def kernel_decode_attention(
    q: torch.Tensor,
    kv_arena: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    scale: float,
    pdl: PdlPolicy = DEFAULT_PDL,
) -> torch.Tensor:
    """A decode-only step's attention through the Triton kernel, over a cache
    that already holds the step's keys and values (RotaryEmbedding.rotate_into_cache).

    q: [B, heads, head_dim]; kv_arena: [pages, layers, 2, block_size, kv_heads,
    head_dim]. Same result as paged_decode_attention, with no host sync
    (CUDA-graph safe): only device tensors of ``meta`` are read. No sliding
    window. pdl: which launches take part in PDL (kernels/pdl.py).
    """
    if meta.sliding_window is not None:
        raise ValueError("the decode kernel has no sliding window")
    return paged_attention_decode(q.contiguous(), kv_arena, layer, meta.block_tables, meta.context_lens, scale,
                                  pdl=pdl)
