"""Decode steps replayed from CUDA graphs.

A decode-only step of B sequences runs as the replay of a graph captured for
the smallest batch bucket >= B. The batch is padded to the bucket by repeating
its first sequence (same token, position, slot and block table): the duplicate
rows write the same K/V into the same slot, and a token weight of 0 keeps them
out of the routing statistics; their logits are not sampled.

What a graph reads at replay time, so nothing is ever re-captured:
* static input buffers written before each replay (token ids, positions,
  slots, block tables [bucket, max_blocks], context lengths, token weights);
* the KV arena (any page may hold any sequence's block);
* the weight store's page table and ``block_fields``: precision changes
  (demotions, committed promotions, blocks moved to the host) take effect at
  the next replay. A host-only block's rows name its master's pinned host
  pages, which the kernels read in place, so host-only blocks replay too.

The runner records the routed blocks' use after every step, replayed or not
(``ModelRunner.touch_routed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from torch import nn

from dataplane.forward_context import ForwardContext
from dataplane.kv_cache import KVCacheManager
from dataplane.layers.attention import AttentionMetadata
from dataplane.routing_stats import RoutingStats
from dataplane.sampler import greedy_tokens
from dataplane.weights.paged_experts import PagedExperts

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Capture sizes up to ``max_batch`` (which is always one of them)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return tuple(b for b in DEFAULT_BUCKETS if b < max_batch) + (max_batch,)


@dataclass
class DecodeRows:
    """Host description of a decode batch (one row per sequence)."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    tables: list[list[int]]  # each sequence's KV pages

    def __len__(self) -> int:
        return len(self.input_ids)


# Triton specializes a pointer argument on 16-byte alignment. Every view of a
# graph's input buffer starts on such a boundary, so a replay launches the
# kernel variants that an eager step (fresh tensors) launches too. With the
# block tables at byte offset 4 * bucket, buckets 1 and 2 compiled a decode
# attention variant of their own, and an eager two-sequence step (a block
# host-only) compiled the aligned one live (tests/dataplane/test_dp_warm_coverage.py
# on the H100; benchmarks/NOTES.md, session 44).
VIEW_ALIGN_BYTES = 16


def _aligned_count(n: int, itemsize: int) -> int:
    """n elements of itemsize bytes, rounded up to whole VIEW_ALIGN_BYTES."""
    step = VIEW_ALIGN_BYTES // itemsize
    return -(-n // step) * step


@dataclass
class _Inputs:
    """A graph's static inputs: views of one device buffer, filled by one copy.

    Rows of ``ids`` ([4, bucket] int64): token ids, positions, slots, token
    weights (1 = real row, 0 = padding). ``context_lens`` ([bucket] int32)
    and ``block_tables`` ([bucket, max_blocks] int32). All are views of one
    byte buffer (``device``), each starting VIEW_ALIGN_BYTES-aligned, with
    host twins (pinned on CUDA), so a step's inputs go up in one asynchronous
    copy. Two host twins are used in turn: a step may be filled while the
    previous one (launched ahead, not collected) still waits for its upload,
    and the runner has waited for the step before that, whose upload went
    first.
    """

    hosts: tuple[torch.Tensor, torch.Tensor]  # [nbytes] uint8 each
    device: torch.Tensor  # [nbytes] uint8
    host_views: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]  # (ids, context_lens, block_tables)
    ids: torch.Tensor  # [4, bucket] int64, view of device (rows aligned)
    context_lens: torch.Tensor  # [bucket] int32, view of device
    block_tables: torch.Tensor  # [bucket, max_blocks] int32, view of device
    turn: int = 0  # the host twin the next fill writes

    @classmethod
    def allocate(cls, bucket: int, max_blocks: int, device: torch.device) -> "_Inputs":
        row = _aligned_count(bucket, 8)  # int64 elements per ids row
        lens = _aligned_count(bucket, 4)  # int32 elements before the block tables
        ids_bytes = 4 * row * 8
        nbytes = ids_bytes + 4 * (lens + bucket * max_blocks)
        hosts = tuple(torch.zeros(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda") for _ in range(2))
        dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)

        def views(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            ints = buf[ids_bytes:].view(torch.int32)
            return (buf[:ids_bytes].view(torch.int64).view(4, row)[:, :bucket], ints[:bucket],
                    ints[lens:].view(bucket, max_blocks))

        ids, context_lens, block_tables = views(dev)
        return cls(hosts, dev, (views(hosts[0]), views(hosts[1])), ids, context_lens, block_tables)

    def next_host(self) -> tuple[torch.Tensor, ...]:
        """(ids [4, bucket] int64, context_lens [bucket] int32, block_tables
        [bucket, max_blocks] int32) of the host twin to fill now."""
        return self.host_views[self.turn]

    def upload(self) -> None:
        """Sends the twin just filled; the next fill takes the other one."""
        self.device.copy_(self.hosts[self.turn], non_blocking=True)
        self.turn ^= 1


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: eager mode (see DecodeGraphs)
    inputs: _Inputs
    input_ids: torch.Tensor  # [bucket] int64 (views of inputs.ids / context_lens / block_tables)
    positions: torch.Tensor  # [bucket] int64
    slots: torch.Tensor  # [bucket] int64
    block_tables: torch.Tensor  # [bucket, max_blocks] int32
    context_lens: torch.Tensor  # [bucket] int32
    token_weight: torch.Tensor  # [bucket] int64, 1 = real row, 0 = padding
    routing: RoutingStats
    logits: torch.Tensor | None = None  # [bucket, vocab] in the model's dtype, written by the replay
    greedy: torch.Tensor | None = None  # [bucket] int64 greedy picks of those logits, written by the replay
    # The captured work, returning (logits, greedy); run directly when graph is None.
    step: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None


class DecodeGraphs:
    """Captures and replays the model's decode step, one graph per batch bucket.

    Contract: ``model(input_ids, positions, ctx)`` and
    ``model.compute_logits(hidden, float32=False)`` must be capturable (no host syncs, no
    data-dependent allocation) when ``ctx.kv_arena`` is set and the batch is
    decode-only; the models and kernels of this package are. Graphs share one
    memory pool. Not thread-safe: the engine thread drives it.

    capture=False runs the same static-buffer step eagerly instead of
    replaying it (any device): the padding and bookkeeping, testable on a CPU.
    """

    def __init__(
        self,
        model: nn.Module,
        kv: KVCacheManager,
        num_layers: int,
        num_experts: int,
        max_batch: int,
        max_blocks_per_seq: int,
        *,
        capture: bool = True,
    ) -> None:
        if kv.cache_view is None:
            raise ValueError("decode graphs need a KV cache with storage")
        if capture and not kv.cache_view.is_cuda:
            raise ValueError("CUDA graphs need a KV cache on a CUDA device")
        self.capture = capture
        self.model = model
        self.kv = kv
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.device = kv.cache_view.device
        self.buckets = batch_buckets(max_batch)
        self.max_blocks = max_blocks_per_seq
        paged = [m for m in model.modules() if isinstance(m, PagedExperts)]
        self._stores = list({id(m.store): m.store for m in paged}.values())
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = 0
        self.captures = 0

    def bucket(self, batch: int) -> int | None:
        """The capture size for ``batch`` rows, None when too large."""
        return next((b for b in self.buckets if b >= batch), None)

    def can_replay(self, rows: DecodeRows) -> bool:
        """Whether this decode batch may run as a replay (else: eager)."""
        if not rows or self.bucket(len(rows)) is None:
            return False
        return all(len(t) <= self.max_blocks for t in rows.tables)

    @torch.inference_mode()
    def replay(
        self, rows: DecodeRows, device_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, RoutingStats]:
        """Runs the step; returns (logits [B, vocab] in the model's dtype, their
        greedy picks [B] int64 (dataplane/sampler.py's ``greedy_tokens``), the
        step's routing).

        All three are views of the graph's static outputs: read them (or queue
        the work that reads them) before the next replay of the same bucket.
        ``device_ids`` ([B] int64 on the device) replaces ``rows.input_ids``:
        copied into the graph's input after the host upload, in stream order,
        so it may be the output of a step still queued.
        """
        bucket = self.bucket(len(rows))
        assert bucket is not None and self.can_replay(rows)
        for store in self._stores:
            store.poll()  # commit landed promotions before the graph reads the tables
        g = self._graphs.get(bucket)
        if g is None:
            g = self._capture(bucket, rows)
        self._fill(g, rows)
        if device_ids is not None:
            n = len(rows)
            g.input_ids[:n].copy_(device_ids[:n])
            g.input_ids[n:].copy_(device_ids[:1].expand(g.input_ids.shape[0] - n))  # padding repeats row 0
        if g.graph is None:
            assert g.step is not None
            g.logits, g.greedy = g.step()
        else:
            g.graph.replay()
        self.replays += 1
        assert g.logits is not None and g.greedy is not None
        return g.logits[: len(rows)], g.greedy[: len(rows)], g.routing

    # -- internals ----------------------------------------------------------------
    def _fill(self, g: _Graph, rows: DecodeRows) -> None:
        # numpy views of the host buffers: a few array ops per step whatever
        # the batch (a torch op per row cost ~1 ms of host time at B = 64).
        n, bucket = len(rows), g.input_ids.shape[0]
        host_ids, host_lens, host_tables = g.inputs.next_host()
        ids = host_ids.numpy()  # [4, bucket]
        ids[:3, :n] = (rows.input_ids, rows.positions, rows.slots)
        ids[3, :n] = 1
        ids[3, n:] = 0
        ids[:3, n:] = ids[:3, :1]  # padding rows repeat the first sequence
        lengths = host_lens.numpy()  # [bucket]
        lengths[:n] = ids[1, :n] + 1  # cached tokens after this step
        lengths[n:] = lengths[0]
        tables = host_tables.numpy()  # [bucket, max_blocks]
        counts = np.fromiter((len(t) for t in rows.tables), dtype=np.int64, count=n)
        filled = np.arange(self.max_blocks) < counts[:, None]  # [n, max_blocks]
        tables[:n] = 0
        tables[:n][filled] = np.fromiter(chain.from_iterable(rows.tables), dtype=np.int32, count=int(counts.sum()))
        tables[n:] = tables[0]
        g.inputs.upload()

    def _capture(self, bucket: int, rows: DecodeRows) -> _Graph:
        dev = self.device
        inputs = _Inputs.allocate(bucket, self.max_blocks, dev)
        token_weight = inputs.ids[3]
        g = _Graph(
            graph=torch.cuda.CUDAGraph() if self.capture else None,
            inputs=inputs,
            input_ids=inputs.ids[0],
            positions=inputs.ids[1],
            slots=inputs.ids[2],
            block_tables=inputs.block_tables,
            context_lens=inputs.context_lens,
            token_weight=token_weight,
            routing=RoutingStats(
                self.num_layers, self.num_experts, torch.arange(bucket, device=dev), bucket, token_weight
            ),
        )
        # Real data in the buffers: the warm-up runs below execute the step
        # for real (they write the same K/V the replay will write again).
        self._fill(g, rows)
        meta = AttentionMetadata(
            slot_mapping=g.slots,
            query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=dev),
            context_lens=g.context_lens,
            block_tables=g.block_tables,
            query_lens_host=[1] * bucket,
            context_lens_host=[self.max_blocks * self.kv.block_size] * bucket,
            block_size=self.kv.block_size,
            sliding_window=None,
        )
        ctx = ForwardContext(attn=meta, kv_caches=self.kv.layer_caches, routing=g.routing, kv_arena=self.kv.cache_view)

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            g.routing.reset()
            hidden = self.model(g.input_ids, g.positions, ctx)  # [bucket, H]
            # The greedy picks inside the graph, from the logits in the
            # model's dtype: no float32 cast and no argmax launch after the
            # replay (kernels/row_argmax.py).
            logits = self.model.compute_logits(hidden, float32=False)  # [bucket, vocab]
            return logits, greedy_tokens(logits)  # [bucket] int64

        g.step = step
        self._graphs[bucket] = g
        if g.graph is None:
            return g
        # Warm-up on a side stream (compiles Triton kernels, settles the allocator).
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(dev).wait_stream(side)
        with torch.cuda.graph(g.graph, pool=self._pool):
            g.logits, g.greedy = step()
        self.captures += 1
        return g
