"""Continuous batching with a token budget, chunked prefill and preemption.

Each step the scheduler picks, in priority order (earlier arrival first):

1. running sequences: one token for a decode, the rest of the prompt (up to
   the remaining budget) for an unfinished prefill;
2. waiting sequences, while the budget, ``max_running_seqs`` and free KV
   blocks allow (their first chunk may be shorter than the prompt).

When a running sequence needs KV blocks that the arena does not have, the
scheduler first calls ``reclaim_pages(n)`` (the precision controller demotes
expert weights to free arena pages) and only if fewer than ``n`` pages came
back does it preempt: the latest-arrived running sequence loses its blocks
and goes back to the front of the waiting queue, to be recomputed. Admission
of a waiting sequence also calls ``reclaim_pages`` before giving up, but
never preempts.

A sequence admitted without blocks (new, or preempted) first attaches the
longest prefix of its tokens that the KV cache holds (dataplane/kv_cache.py),
always leaving its last token to compute (its logits give the next token);
one that asked for prompt logprobs it does not have yet computes them all.
When a running sequence is still computing the next block such a sequence
could attach, admission stops for this step: the block is computed once.
After each step the sequences' newly computed full blocks are registered.
Plain Python: no tensors, testable without a GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.kv_cache import KVCacheManager
from dataplane.memory.arena import OutOfPages
from dataplane.sequence import FinishReason, Sequence, SequenceStatus

# reclaim_pages(n_pages) -> pages actually freed in the arena (0..n or more).
ReclaimPages = Callable[[int], int]


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_seqs: int
    max_batched_tokens: int
    max_model_len: int  # context length: prompt + generated tokens


@dataclass
class ScheduledSeq:
    """A sequence's share of one step: ``num_new_tokens`` tokens from ``start``."""

    seq: Sequence
    start: int  # first position computed this step (= num_computed_tokens)
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last token: sample next."""
        return self.start + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Sequences the arena cannot hold even alone (finished: ABORT, or LENGTH
    # when they had generated tokens).
    rejected: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    """Waiting and running queues over a KV block manager."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        reclaim_pages: ReclaimPages | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.reclaim_pages = reclaim_pages
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept sorted by arrival
        self.preemptions_total = 0
        # Tokens whose K/V came from the prefix cache at admission.
        self.cached_tokens_total = 0

    # -- queue management ----------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq_id: str) -> Sequence | None:
        """Removes a sequence wherever it is, frees its blocks; None if unknown."""
        for seq in self.running:
            if seq.seq_id == seq_id:
                self.running.remove(seq)
                return self._finish(seq, FinishReason.ABORT)
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                return self._finish(seq, FinishReason.ABORT)
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_batched_tokens
        kept: list[Sequence] = []
        queue = list(self.running)  # by arrival; victims are taken from the tail
        while queue and budget > 0:
            seq = queue.pop(0)
            n = min(seq.num_uncomputed_tokens, budget)
            if not self._reserve(seq, n, victims=queue, out=out):
                continue  # seq preempted itself or was rejected
            kept.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
        kept.extend(queue)  # not reached this step (budget spent): still running
        self.running = kept
        if not out.preempted:
            self._admit(out, budget)
        return out

    def _reserve(self, seq: Sequence, n: int, victims: list[Sequence], out: SchedulerOutput) -> bool:
        """Ensures blocks for ``n`` more tokens of a running ``seq``, preempting if needed.

        Returns False when ``seq`` itself had to leave the batch.
        """
        total = seq.num_computed_tokens + n
        while not self._try_allocate(seq, total):
            if victims:
                self._preempt(victims.pop(), out)
            elif out.scheduled:
                # Higher-priority sequences hold the blocks: retry this one later.
                self._preempt(seq, out)
                return False
            else:
                # It is the only sequence holding KV and still does not fit.
                self._reject(seq, out)
                return False
        return True

    def _try_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        needed = self.kv.blocks_needed(seq.seq_id, num_tokens)
        if needed > self.kv.free_blocks and self.reclaim_pages is not None:
            self.reclaim_pages(needed - self.kv.free_blocks)
        try:
            self.kv.allocate(seq.seq_id, num_tokens)
        except OutOfPages:
            return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.kv.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.preemptions_total += 1

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_seqs:
            seq = self.waiting[0]
            uses_cache = self._may_use_cache(seq)
            cached = self._attach_cached_prefix(seq) if uses_cache else 0
            if uses_cache and self._prefix_in_flight(seq):
                self._release_cached(seq, cached)
                return  # next step it attaches what another sequence computes now
            n = min(seq.num_uncomputed_tokens, budget)
            if not self._try_allocate(seq, seq.num_computed_tokens + n):
                self._release_cached(seq, cached)  # it waits without holding pages
                if self.kv.used_blocks == 0:
                    # Nothing else holds KV and it still does not fit: it never will.
                    self.waiting.popleft()
                    self._reject(seq, out)
                    continue
                return
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
            self.cached_tokens_total += cached
            if not seq.output_token_ids:
                seq.num_cached_prompt_tokens = cached

    def _may_use_cache(self, seq: Sequence) -> bool:
        """A sequence without blocks that needs no prompt logprobs it lacks."""
        if not self.kv.prefix_caching or seq.num_computed_tokens or self.kv.num_blocks(seq.seq_id):
            return False
        return seq.sampling.prompt_logprobs is None or len(seq.prompt_logprobs) >= seq.num_prompt_tokens - 1

    def _attach_cached_prefix(self, seq: Sequence) -> int:
        """Attaches the cached K/V of the sequence's leading full blocks (not
        its last token); returns the tokens they hold."""
        max_blocks = (seq.num_tokens - 1) // self.kv.block_size
        cached = self.kv.attach_prefix(seq.seq_id, seq.tokens(0, seq.num_tokens), max_blocks)
        seq.num_computed_tokens = cached
        return cached

    def _release_cached(self, seq: Sequence, cached: int) -> None:
        """Undoes ``_attach_cached_prefix`` for a sequence that stays waiting."""
        if cached:
            self.kv.free(seq.seq_id)
            seq.num_computed_tokens = 0

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """Whether a running sequence has the next full block of ``seq``'s
        tokens (past what the cache gave it) and has not computed it yet:
        waiting for it to be registered beats computing it twice (the n
        choices of one prompt, requests sharing a new system prompt)."""
        end = (seq.num_computed_tokens // self.kv.block_size + 1) * self.kv.block_size
        if end > seq.num_tokens - 1:  # not a block it could attach (its last token is computed anyway)
            return False
        wanted = seq.tokens(0, end)
        return any(
            other.num_computed_tokens < end <= other.num_tokens and other.tokens(0, end) == wanted
            for other in self.running
        )

    def _reject(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Ends a sequence the arena cannot hold even alone.

        LENGTH when it has generated tokens (it reached the context the engine
        can hold), ABORT when it never started.
        """
        self._finish(seq, FinishReason.LENGTH if seq.output_token_ids else FinishReason.ABORT)
        out.rejected.append(seq)

    def schedule_ahead(self, step: list[ScheduledSeq]) -> list[ScheduledSeq] | None:
        """The decode step that follows ``step`` if all its sequences go on, or None.

        Called while ``step`` still runs (before ``update`` sees its tokens),
        so that the next step can be queued behind it. Only a plain decode
        batch qualifies: nobody waiting for admission, every sequence running
        and sampling one token this step without repetition penalties or a
        grammar, and
        none that this step's token
        finishes by length (a stop token is only known later: its row of the
        next step is then computed and dropped). Each sequence gets the KV
        slot of position ``num_tokens`` (the token ``step`` samples) from free
        blocks, never by reclaiming or preempting. The returned items read
        ``samples`` true once ``update`` has appended ``step``'s tokens.
        """
        if self.waiting or not step or len(step) != len(self.running):
            return None
        params_ok = all(
            item.seq.status == SequenceStatus.RUNNING
            and item.num_new_tokens == 1
            and item.samples
            and len(item.seq.output_token_ids) + 1 < item.seq.sampling.max_tokens
            and item.seq.num_tokens + 1 < self.config.max_model_len
            # A penalized or grammar-masked pick needs the token this step
            # samples (unknown to the host yet).
            and not item.seq.sampling.needs_history
            for item in step
        )
        if not params_ok:
            return None
        needed = sum(self.kv.blocks_needed(item.seq.seq_id, item.seq.num_tokens + 1) for item in step)
        if needed > self.kv.free_blocks:
            return None
        for item in step:
            self.kv.allocate(item.seq.seq_id, item.seq.num_tokens + 1)
        return [ScheduledSeq(item.seq, item.seq.num_tokens, 1) for item in step]

    # -- after the step ------------------------------------------------------
    def update(self, scheduled: list[ScheduledSeq], sampled: dict[str, int], eos_ids: frozenset[int]) -> list[Sequence]:
        """Applies a step's results; returns the sequences that finished.

        ``sampled`` maps seq_id to the new token of every sequence whose
        ``ScheduledSeq.samples`` was true.
        """
        finished: list[Sequence] = []
        for item in scheduled:
            seq = item.seq
            if seq.is_finished:  # aborted while the step ran
                continue
            seq.num_computed_tokens = item.start + item.num_new_tokens
            self.kv.commit(seq.seq_id, seq.num_computed_tokens, seq.tokens)
            token = sampled.get(seq.seq_id)
            if token is None:
                continue
            seq.output_token_ids.append(token)
            reason = self._stop_reason(seq, token, eos_ids)
            if seq.grammar is not None and (not seq.grammar.accept(token) or seq.grammar.terminated):
                # Complete (or, were the mask ever bypassed, broken): no further token can follow.
                reason = reason or FinishReason.STOP
            if reason is not None:
                self.running.remove(seq)
                finished.append(self._finish(seq, reason))
        return finished

    def _stop_reason(self, seq: Sequence, token: int, eos_ids: frozenset[int]) -> FinishReason | None:
        params = seq.sampling
        if token in params.stop_token_ids or (not params.ignore_eos and token in eos_ids):
            return FinishReason.STOP
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> Sequence:
        self.kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        return seq
