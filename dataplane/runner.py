"""Builds a step's batch tensors and runs the model.

Input: the scheduler's ``ScheduledSeq`` list. Output: the sampled token of
every sequence that completed its tokens this step, plus the step's routing
statistics. The batch is flattened (see dataplane/layers/attention.py).

A step is launched, then collected: between the two the device works and the
caller's thread is free (the engine does the previous step's bookkeeping
there, so that host time hides behind the device's). A decode step replayed
from a graph samples its tokens on the device at launch (``Sampler.pick``);
the next decode step can then be queued behind it (``launch_ahead``) with its
token ids copied on the device, before the host has seen them.
"""

from __future__ import annotations

import torch
from torch import nn

from dataplane.cuda_graphs import DecodeGraphs, DecodeRows
from dataplane.forward_context import ForwardContext
from dataplane.kv_cache import KVCacheManager
from dataplane.layers.attention import AttentionMetadata
from dataplane.logprobs import TokenLogprobs, step_logprobs
from dataplane.routing_stats import RoutingStats
from dataplane.sampler import Sampler
from dataplane.scheduler import ScheduledSeq
from dataplane.step_records import (
    DevicePicks,
    HostStats,
    LaunchedStep,
    PromptLogprobs,
    StepResult,
    start_host_copy,
)
from dataplane.weights.layout import NUM_PROJ
from dataplane.weights.paged_experts import PagedExperts
from dataplane.weights.store import WeightStore

# Prompt rows whose logits are made at once for prompt logprobs: [rows, vocab]
# float32 is 128 MiB at a 32k vocabulary.
PROMPT_LOGPROBS_ROWS = 1024


class ModelRunner:
    """Owns the model on its device; one ``launch`` + ``collect`` per engine step.

    ``decode_kernels``: decode-only steps attend through the Triton kernels
    over the whole KV arena (CUDA; block size and head dim powers of two).
    ``graphs``: decode-only steps that qualify replay a captured CUDA graph
    (dataplane/cuda_graphs.py); the rest run eagerly.
    """

    def __init__(
        self,
        model: nn.Module,
        kv: KVCacheManager,
        num_layers: int,
        num_experts: int,
        device: torch.device,
        sliding_window: int | None,
        sampler: Sampler,
        *,
        decode_kernels: bool = False,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        if (decode_kernels or graphs is not None) and (kv.cache_view is None or sliding_window is not None):
            raise ValueError("decode kernels and CUDA graphs need a KV arena with storage and no sliding window")
        self.model = model
        self.kv = kv
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.device = device
        self.sliding_window = sliding_window
        self.sampler = sampler
        self.decode_kernels = decode_kernels or graphs is not None
        self.graphs = graphs
        self.paged_experts = [m for m in model.modules() if isinstance(m, PagedExperts)]
        self.steps_launched_ahead = 0  # launch_ahead calls that queued a step
        self._touch_groups = _touch_groups(self.paged_experts, num_layers)

    def prepare(self, scheduled: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        """(input_ids [T], positions [T], context) for the scheduled sequences."""
        block_size = self.kv.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_index: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        for i, item in enumerate(scheduled):
            seq, start, n = item.seq, item.start, item.num_new_tokens
            table = self.kv.block_table(seq.seq_id)
            input_ids += seq.tokens(start, start + n)
            positions += range(start, start + n)
            slots += [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
            seq_index += [i] * n
            query_lens.append(n)
            context_lens.append(start + n)
            tables.append(table)
        max_blocks = max(len(t) for t in tables)
        padded = [t + [0] * (max_blocks - len(t)) for t in tables]
        query_start = [0]
        for n in query_lens:
            query_start.append(query_start[-1] + n)

        def dev(values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        token_seq = dev(seq_index, torch.int64)  # [T]
        meta = AttentionMetadata(
            slot_mapping=dev(slots, torch.int64),
            query_start_loc=dev(query_start, torch.int32),
            context_lens=dev(context_lens, torch.int32),
            block_tables=dev(padded, torch.int32),
            query_lens_host=query_lens,
            context_lens_host=context_lens,
            block_size=block_size,
            sliding_window=self.sliding_window,
        )
        routing = RoutingStats(self.num_layers, self.num_experts, token_seq, len(scheduled))
        kv_arena = self.kv.cache_view if self.decode_kernels else None
        ctx = ForwardContext(attn=meta, kv_caches=self.kv.layer_caches, routing=routing, kv_arena=kv_arena)
        return dev(input_ids, torch.int64), dev(positions, torch.int64), ctx

    def decode_rows(self, scheduled: list[ScheduledSeq], known_tokens: bool = True) -> DecodeRows | None:
        """The batch as one row per sequence, None unless every sequence computes one token.

        known_tokens=False: the input tokens are not on the host yet (a step
        launched ahead); their ids are 0 here and come from the device.
        """
        if any(item.num_new_tokens != 1 for item in scheduled):
            return None
        rows = DecodeRows([], [], [], [])
        for item in scheduled:
            seq_id, pos = item.seq.seq_id, item.start
            rows.input_ids.append(item.seq.tokens(pos, pos + 1)[0] if known_tokens else 0)
            rows.positions.append(pos)
            rows.slots.append(self.kv.slot(seq_id, pos))
            rows.tables.append(self.kv.block_table(seq_id))
        return rows

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledSeq]) -> LaunchedStep:
        """Queues one step's device work and returns without waiting for it.

        ``scheduled`` must be non-empty with blocks allocated. The host copies
        of the routing statistics are queued behind the forward. Until
        ``collect`` returns, the caller may do host work that needs no result
        of this step (the engine does the previous step's bookkeeping there).
        """
        if self.graphs is not None:
            rows = self.decode_rows(scheduled)
            if rows is not None and self.graphs.can_replay(rows):
                logits, greedy, routing = self.graphs.replay(rows)  # [B, vocab], [B]
                if all(item.samples for item in scheduled):
                    return self._picked_step(scheduled, logits, greedy, routing)
                sampling = [i for i, item in enumerate(scheduled) if item.samples]
                if len(sampling) < len(scheduled):
                    logits = logits[sampling] if sampling else None
                return LaunchedStep(scheduled, logits, HostStats.start(routing, len(scheduled)), len(rows),
                                    host_only=self._host_only_now())
        input_ids, positions, ctx = self.prepare(scheduled)
        hidden = self.model(input_ids, positions, ctx)  # [T, H]
        logits = None
        if any(item.samples for item in scheduled):
            last_rows: list[int] = []
            row = 0
            for item in scheduled:
                row += item.num_new_tokens
                if item.samples:
                    last_rows.append(row - 1)
            rows_t = torch.tensor(last_rows, device=self.device)
            logits = self.model.compute_logits(hidden[rows_t])  # [S, vocab] float32
        assert ctx.routing is not None
        stats = HostStats.start(ctx.routing, len(scheduled))
        prompt_logprobs = self._prompt_logprobs(scheduled, hidden)
        return LaunchedStep(scheduled, logits, stats, int(input_ids.shape[0]), prompt_logprobs=prompt_logprobs,
                            host_only=self._host_only_now())

    def _prompt_logprobs(self, scheduled: list[ScheduledSeq], hidden: torch.Tensor) -> list[PromptLogprobs]:
        """Log-probabilities of the prompt tokens this step's rows predict, for
        sequences that asked (queued on the device). Position p's row predicts
        token p + 1; positions whose entries the sequence holds already (a
        recompute after preemption) are skipped. Logits are made
        PROMPT_LOGPROBS_ROWS rows at a time, to bound their memory.

        hidden: [T, H], the step's rows in scheduled order."""
        found: list[PromptLogprobs] = []
        row = 0  # the item's first row in ``hidden``
        for item in scheduled:
            seq, top_n = item.seq, item.seq.sampling.prompt_logprobs
            offset, row = row, row + item.num_new_tokens
            if top_n is None:
                continue
            first = max(item.start, len(seq.prompt_logprobs))
            end = min(item.start + item.num_new_tokens, seq.num_prompt_tokens - 1)  # positions [first, end)
            for start in range(first, end, PROMPT_LOGPROBS_ROWS):
                stop = min(start + PROMPT_LOGPROBS_ROWS, end)
                rows = hidden[offset + start - item.start : offset + stop - item.start]  # [P, H]
                logits = self.model.compute_logits(rows)  # [P, vocab] float32
                targets = torch.tensor(seq.prompt_token_ids[start + 1 : stop + 1], dtype=torch.int64)
                values = step_logprobs(logits, targets.to(self.device, non_blocking=True), [top_n] * (stop - start))
                assert values is not None
                found.append(PromptLogprobs(seq.seq_id, start, values))
        return found

    @torch.inference_mode()
    def launch_ahead(self, scheduled: list[ScheduledSeq], previous: LaunchedStep) -> LaunchedStep | None:
        """Queues the decode step that follows ``previous`` before ``previous`` is collected.

        ``scheduled``: Scheduler.schedule_ahead(previous.scheduled), the same
        sequences in the same order, one position further. Their input tokens
        are ``previous``'s picks, copied on the device. Returns None (nothing
        queued) when ``previous`` has no device picks or the batch cannot
        replay a graph.
        The caller must drop this step's tokens for sequences that
        ``previous``'s tokens finished.
        """
        picks = previous.picks
        if self.graphs is None or picks is None or len(scheduled) != len(previous.scheduled):
            return None
        rows = self.decode_rows(scheduled, known_tokens=False)
        if rows is None or not self.graphs.can_replay(rows):
            return None
        logits, greedy, routing = self.graphs.replay(rows, device_ids=picks.ids)
        self.steps_launched_ahead += 1
        return self._picked_step(scheduled, logits, greedy, routing)

    def _picked_step(
        self, scheduled: list[ScheduledSeq], logits: torch.Tensor, greedy: torch.Tensor, routing: RoutingStats
    ) -> LaunchedStep:
        """A replayed step whose rows all sample: picks and host copies queued now.

        The picks must be queued before another replay of the same graph
        overwrites ``logits`` and ``greedy`` (an all-greedy batch's picks are
        ``greedy`` itself: the step launched ahead copies them into its input
        in stream order, before its replay); the copies are queued before the
        picks' event.
        """
        seqs = [item.seq for item in scheduled]
        ids = self.sampler.pick(logits, seqs, greedy)  # [B] int64
        logprobs = step_logprobs(logits, ids, [seq.sampling.logprobs for seq in seqs])
        if logprobs is not None:
            logprobs = logprobs.map_tensors(start_host_copy)
        stats = HostStats.start(routing, len(scheduled))
        host = start_host_copy(ids)
        done = None
        if ids.is_cuda:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(ids.device))
        return LaunchedStep(scheduled, None, stats, len(scheduled), DevicePicks(ids, host, done, logprobs),
                            host_only=self._host_only_now())

    def _host_only_now(self) -> tuple[frozenset[int], ...]:
        """Each weight store's host-only blocks (``_touch_groups`` order), taken
        once a step's device work is queued: the blocks it reads from the host."""
        return tuple(store.host_only_set() for store, _, _ in self._touch_groups)

    @torch.inference_mode()
    def collect(self, step: LaunchedStep) -> StepResult:
        """Samples the launched step's sampling sequences and waits for its statistics.

        One wait for the device per step: the sampled ids; the statistics'
        copies were queued before them.
        """
        sampled: dict[str, int] = {}
        logprobs: dict[str, TokenLogprobs] = {}
        if step.picks is not None:
            if step.picks.done is not None:
                step.picks.done.synchronize()  # this step only: a step launched ahead may still run
            for item, token in zip(step.scheduled, step.picks.host.tolist()):
                sampled[item.seq.seq_id] = token
            if step.picks.logprobs is not None:
                picked = step.picks.logprobs
                for row, entry in zip(picked.rows, picked.entries()):
                    logprobs[step.scheduled[row].seq.seq_id] = entry
        else:
            if step.logits is not None:
                seqs = [item.seq for item in step.scheduled if item.samples]
                ids = self.sampler.pick(step.logits, seqs)  # [S] int64
                for seq, token in zip(seqs, ids.tolist()):
                    sampled[seq.seq_id] = token
                computed = step_logprobs(step.logits, ids, [seq.sampling.logprobs for seq in seqs])
                if computed is not None:
                    computed = computed.map_tensors(torch.Tensor.cpu)
                    for row, entry in zip(computed.rows, computed.entries()):
                        logprobs[seqs[row].seq_id] = entry
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # the statistics' copies have landed
        prompt_logprobs: dict[str, list[tuple[int, list[TokenLogprobs]]]] = {}
        for part in step.prompt_logprobs:
            entries = part.values.map_tensors(torch.Tensor.cpu).entries()
            prompt_logprobs.setdefault(part.seq_id, []).append((part.first, entries))
        stats = step.stats
        return StepResult(
            sampled=sampled,
            routed_tokens=stats.routed_tokens,
            prob_mass=stats.prob_mass,
            seq_prob_sum=stats.seq_prob_sum,
            num_tokens=step.num_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            host_only=step.host_only,
        )

    def touch_routed(self, routed_tokens: torch.Tensor, host_only: tuple[frozenset[int], ...] = ()) -> None:
        """LRU bookkeeping of the paged experts: routed_tokens [layers, experts] host counts.

        One access per store per step for all its routed blocks (blocks used in
        the same step are equally recent); the block ids come from one tensor
        expression, not a Python loop per layer. ``host_only``: the step's
        ``StepResult.host_only`` (default: each store's host-only blocks now),
        whose routed blocks count as host reads (WeightStore.record_use).
        """
        hit = routed_tokens.nonzero()  # [n, 2] (layer, expert)
        for i, (store, served, num_experts) in enumerate(self._touch_groups):
            pairs = hit[served[hit[:, 0]]]  # rows whose layer has a paged-experts module on this store
            first = (pairs[:, 0] * num_experts + pairs[:, 1]) * NUM_PROJ  # [m] block_index(l, e, 0), vectorized
            blocks = first[:, None] + torch.arange(NUM_PROJ)  # [m, NUM_PROJ]
            store.record_use(blocks.flatten().tolist(), host_only[i] if host_only else None)


def _touch_groups(modules: list[PagedExperts], num_layers: int) -> list[tuple[WeightStore, torch.Tensor, int]]:
    """(store, served bool [layers], experts per layer) for each weight store behind the modules."""
    groups: dict[int, tuple[WeightStore, torch.Tensor, int]] = {}
    for m in modules:
        store, served, experts = groups.setdefault(
            id(m.store), (m.store, torch.zeros(num_layers, dtype=torch.bool), m.num_experts)
        )
        if m.num_experts != experts:
            raise ValueError("paged-experts modules on one store must have the same expert count")
        served[m.layer] = True
    return list(groups.values())
