"""The engine loop: receive -> schedule -> launch -> (previous step's
bookkeeping, while the device works) -> collect -> update -> emit.

With ``overlap_steps`` a decode batch replayed from a graph keeps one step
queued ahead: before collecting step N the engine launches N+1
(Scheduler.schedule_ahead, ModelRunner.launch_ahead: its token ids are N's
picks, sampled on the device), so the device never waits for the host
between decode steps. Step N+1's
tokens of sequences that N finished are dropped. Anything else (a request
arriving or aborted, prefill, an eager step, a full arena) collects the queued
step first and schedules from scratch.

One thread owns the scheduler, the KV manager, the arena and the model. Other
threads talk to it only through ``add_request`` / ``abort`` /
``run_on_engine_thread`` (a command queue, dataplane/engine_commands.py) and
read published snapshots (``stats``, routing sums). Outputs go to each
request's sink, called on the engine thread: a sink must not block
(``QueueSink`` is a per-request queue for in-process callers; the gRPC server
hands outputs to its event loop).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dataplane.engine_commands import Command, call_on_engine_thread
from dataplane.engine_io import (EngineCounters, EngineStats, InvalidRequest, OutputSink, QueueFull, RequestOutput,
                                 engine_stats, request_output, validate_request)
from dataplane.kv_cache import KVCacheManager
from dataplane.logprobs import TokenLogprobs
from dataplane.memory.arena import Arena
from dataplane.model_info import ModelInfo
from dataplane.routing_stats import DemandTracker, RoutingWindow
from dataplane.runner import ModelRunner
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from dataplane.sequence import FinishReason, Sequence, SequenceStatus
from dataplane.step_records import LaunchedStep, StepResult
from dataplane.structured_output import GrammarBackend

IDLE_WAIT_S = 0.05  # how long an idle loop sleeps waiting for commands
STOP_JOIN_S = 30.0


@dataclass(frozen=True)
class _Bookkeeping:
    """A collected step whose routing bookkeeping is still to do (Engine._flush_bookkeeping)."""

    scheduled: list[ScheduledSeq]
    result: StepResult


@dataclass
class _Pending:
    """Book-keeping the caller side needs (under the engine's lock)."""

    ids: set[str] = field(default_factory=set)
    next_arrival: int = 0


class Engine:
    """Continuous-batching engine over one model and one arena."""

    def __init__(
        self,
        model_info: ModelInfo,
        scheduler: Scheduler,
        runner: ModelRunner,
        arena: Arena,
        kv: KVCacheManager,
        fixed_resident_bytes: int,
        max_pending_requests: int,
        demand_decay: float,
        before_step: Callable[[], None] | None = None,
        overlap_steps: bool = False,
    ) -> None:
        """``before_step`` runs on the engine thread once per loop iteration (also
        when idle), before scheduling: the precision controller keeps the arena
        between its watermarks there. Its changes to the weight tables and the
        arena are stream-ordered, so they may happen while a step is queued.
        ``overlap_steps``: queue the next decode step before collecting the
        current one (module docstring)."""
        self.model_info = model_info
        self.scheduler = scheduler
        self.runner = runner
        self.arena = arena
        self.kv = kv
        self.fixed_resident_bytes = fixed_resident_bytes
        self.max_pending_requests = max_pending_requests
        self.before_step = before_step
        self.routing_window = RoutingWindow(model_info.num_layers, model_info.num_experts)
        self.demand = DemandTracker(model_info.num_layers, model_info.num_experts, demand_decay)
        self._eos = frozenset(model_info.eos_token_ids)
        self.grammars = GrammarBackend(model_info.tokenizer_json, model_info.vocab_size, model_info.eos_token_ids)
        self._commands: queue.Queue[Command] = queue.Queue()
        self._sinks: dict[str, OutputSink] = {}  # engine thread only
        self._lock = threading.Lock()
        self._pending = _Pending()
        self._counters = EngineCounters()
        self._stats = EngineStats()
        self._bookkeeping: _Bookkeeping | None = None  # engine thread only
        self.overlap_steps = overlap_steps
        self._ahead: LaunchedStep | None = None  # launched, not collected (engine thread only)
        self._thread: threading.Thread | None = None
        self._closed = False  # set by stop() or a crash; no new requests then
        self._error: BaseException | None = None
        self._publish_stats()

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the loop; unfinished requests end with ABORT."""
        with self._lock:
            self._closed = True
        if self._thread is None:
            return
        self._commands.put(Command("stop"))
        self._thread.join(STOP_JOIN_S)
        self._thread = None

    @property
    def error(self) -> BaseException | None:
        """The exception that killed the engine loop, if any."""
        return self._error

    # -- thread-safe API -----------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams, sink: OutputSink
    ) -> None:
        """Queues a request. Raises InvalidRequest or QueueFull (nothing queued then)."""
        validate_request(request_id, prompt_token_ids, sampling, self.model_info, self.kv.block_size,
                         self.arena.num_pages)
        try:
            grammar = self.grammars.start(sampling.structured_output)
        except ValueError as err:
            raise InvalidRequest(str(err)) from err
        with self._lock:
            if self._closed:
                raise RuntimeError(f"engine is stopped (error: {self._error!r})")
            if request_id in self._pending.ids:
                raise InvalidRequest(f"request_id {request_id!r} is already running")
            if len(self._pending.ids) >= self.max_pending_requests:
                raise QueueFull(f"engine holds {self.max_pending_requests} requests already")
            self._pending.ids.add(request_id)
            seq = Sequence(request_id, list(prompt_token_ids), sampling, self._pending.next_arrival, grammar=grammar)
            self._pending.next_arrival += 1
            # Queued under the lock: after stop() nothing can land behind "stop".
            self._commands.put(Command("add", seq=seq, sink=sink))

    def abort(self, request_id: str) -> None:
        """Aborts a request if it is still unfinished (its sink gets ABORT).

        Ids are matched when the engine thread gets to the abort: callers
        must not reuse an id right after its request finished.
        """
        self._commands.put(Command("abort", request_id=request_id))

    def reset_counters(self) -> None:
        """Zeroes the published counters and drains the routing window, once
        the commands queued before this one are applied; returns when done.
        For traffic that must not count (dataplane/warmup.py): call it with
        no requests in flight."""
        self.run_on_engine_thread(self._reset_counters_now)

    def run_on_engine_thread(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on the engine thread between two loop iterations, once
        the commands queued before it are applied, and returns its result
        (raises what it raised). For state only that thread may touch, e.g.
        the weight store."""
        if self._thread is None:
            raise RuntimeError("engine not started")
        return call_on_engine_thread(self._commands, fn, STOP_JOIN_S, lambda: self._error)

    def _reset_counters_now(self) -> None:
        self._counters = EngineCounters()
        self.scheduler.preemptions_total = self.scheduler.cached_tokens_total = 0
        self.routing_window.drain()
        self._publish_stats()

    def count_kernel_compile(self, kernel: str) -> None:
        """Counts one Triton kernel variant compiled (dataplane/kernel_compiles.py;
        called where it compiles, the engine thread); published with the next
        stats, zeroed by reset_counters like the others."""
        self._counters.kernel_compiles += 1

    def stats(self) -> EngineStats:
        """The snapshot published after the latest loop iteration."""
        with self._lock:
            return self._stats

    # -- the loop (engine thread) -------------------------------------------
    # Outputs are collected while the state changes and delivered after the
    # stats are published, so a caller that sees an output also sees its step
    # (and its request's end) in ``stats()``.
    def _loop(self) -> None:
        try:
            while True:
                outbox: list[tuple[OutputSink, RequestOutput]] = []
                busy = self.scheduler.has_work() or self._ahead is not None
                keep_going = self._receive(block=not busy, outbox=outbox)
                if keep_going and self.before_step is not None:
                    self.before_step()
                # A step launched ahead is collected even when its sequences
                # have all been aborted meanwhile.
                if keep_going and (self.scheduler.has_work() or self._ahead is not None):
                    self._step(outbox)
                else:
                    self._flush_bookkeeping()
                self._publish_stats()
                self._deliver(outbox)
                if not keep_going:
                    break
        except BaseException as err:  # the loop must not die silently
            with self._lock:
                self._error = err
                self._closed = True
            raise
        finally:
            self._shutdown()

    def _receive(self, block: bool, outbox: list[tuple[OutputSink, RequestOutput]]) -> bool:
        """Applies queued commands; False when asked to stop."""
        try:
            cmd = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd.kind == "stop":
                return False
            if cmd.kind == "add":
                assert cmd.seq is not None and cmd.sink is not None
                self._sinks[cmd.seq.seq_id] = cmd.sink
                self.scheduler.add(cmd.seq)
            elif cmd.kind == "abort":
                seq = self.scheduler.abort(cmd.request_id)
                if seq is not None:
                    self._end(seq, [], outbox)
            elif cmd.kind == "call":
                cmd.run_call()
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _step(self, outbox: list[tuple[OutputSink, RequestOutput]]) -> None:
        launched, self._ahead = self._ahead, None
        if launched is None:
            out: SchedulerOutput = self.scheduler.schedule()
            for seq in out.preempted:
                self.demand.remove(seq.seq_id)
            for seq in out.rejected:
                self._end(seq, [], outbox)
            if not out.scheduled:
                self._flush_bookkeeping()
                return
            launched = self.runner.launch(out.scheduled)
        if self.overlap_steps and launched.picks is not None:  # graph steps have device picks
            ahead = self.scheduler.schedule_ahead(launched.scheduled)
            if ahead is not None:
                self._ahead = self.runner.launch_ahead(ahead, launched)
        self._flush_bookkeeping()  # the previous step's, while this one runs on the device
        result = self.runner.collect(launched)
        scheduled = launched.scheduled
        # A step launched ahead computed rows for sequences that finished or
        # were aborted since: their tokens do not exist.
        result.sampled = {
            item.seq.seq_id: result.sampled[item.seq.seq_id]
            for item in scheduled
            if item.seq.seq_id in result.sampled and item.seq.status == SequenceStatus.RUNNING
        }
        if result.prompt_logprobs:  # only prefill steps of requests that asked
            for item in scheduled:
                for first, entries in result.prompt_logprobs.get(item.seq.seq_id, ()):
                    item.seq.add_prompt_logprobs(first, entries)
        self._count(scheduled, result)
        self._bookkeeping = _Bookkeeping(scheduled, result)
        finished = {s.seq_id for s in self.scheduler.update(scheduled, result.sampled, self._eos)}
        for item in scheduled:
            seq = item.seq
            token = result.sampled.get(seq.seq_id)
            entry = result.logprobs.get(seq.seq_id)
            logprobs = [entry] if token is not None and entry is not None else []
            if seq.seq_id in finished:
                self._end(seq, [token] if token is not None else [], outbox, logprobs)
            elif token is not None and seq.seq_id in self._sinks:
                outbox.append((self._sinks[seq.seq_id], request_output(seq, [token], None, logprobs)))
        if not self.scheduler.has_work():
            self._flush_bookkeeping()  # no next step to hide it behind

    def _count(self, scheduled: list[ScheduledSeq], result: StepResult) -> None:
        """The step's counters (published with its outputs)."""
        self._counters.steps += 1
        self._counters.generated_tokens += len(result.sampled)
        for item in scheduled:
            seq = item.seq
            is_decode = bool(seq.output_token_ids) and item.start == seq.num_tokens - 1
            if not is_decode:
                self._counters.prompt_tokens += item.num_new_tokens

    def _flush_bookkeeping(self) -> None:
        """Routing window, per-sequence demand and the experts' LRU for the last collected step.

        Deferred by one step: the engine runs it after launching the next step
        (host time that would otherwise leave the device idle: about 0.3 ms
        per step at B = 1 on the H200), or as soon as there is no next step.
        Readers of the routing window and the demand (telemetry, the precision
        controller) therefore lag by at most one step. Sequences that left the
        batch since (finished, aborted, preempted) are not re-added to the
        demand.
        """
        record, self._bookkeeping = self._bookkeeping, None
        if record is None:
            return
        result = record.result
        self.runner.touch_routed(result.routed_tokens, result.host_only)
        self.routing_window.add(result.routed_tokens, result.prob_mass)
        live = [i for i, item in enumerate(record.scheduled) if item.seq.status == SequenceStatus.RUNNING]
        if not live:
            return
        prob_sums = result.seq_prob_sum if len(live) == len(record.scheduled) else result.seq_prob_sum[live]
        self.demand.update(
            [record.scheduled[i].seq.seq_id for i in live],
            prob_sums,
            [record.scheduled[i].num_new_tokens for i in live],
        )

    def _end(
        self,
        seq: Sequence,
        new_tokens: list[int],
        outbox: list[tuple[OutputSink, RequestOutput]],
        logprobs: list[TokenLogprobs] | None = None,
    ) -> None:
        """Forgets a finished sequence and queues its last output (with its
        newest tokens and, when asked for, their log-probabilities)."""
        reason = seq.finish_reason or FinishReason.ABORT
        sink = self._sinks.pop(seq.seq_id, None)
        if sink is not None:
            outbox.append((sink, request_output(seq, new_tokens, reason, logprobs)))
        self.demand.remove(seq.seq_id)
        self._counters.finished += 1
        if reason == FinishReason.ABORT:
            self._counters.aborted += 1
        with self._lock:
            self._pending.ids.discard(seq.seq_id)

    @staticmethod
    def _deliver(outbox: list[tuple[OutputSink, RequestOutput]]) -> None:
        for sink, output in outbox:
            sink(output)

    def _shutdown(self) -> None:
        """Ends every unfinished request with ABORT (the loop is exiting)."""
        outbox: list[tuple[OutputSink, RequestOutput]] = []
        while True:  # requests queued but never received
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if cmd.kind == "add" and cmd.seq is not None and cmd.sink is not None:
                self._sinks[cmd.seq.seq_id] = cmd.sink
                self.scheduler.add(cmd.seq)
            elif cmd.kind == "call":
                cmd.refuse_call("the engine stopped")
        if self._ahead is not None:  # its device work must end before the arena is released
            self.runner.collect(self._ahead)
            self._ahead = None
        self._flush_bookkeeping()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.abort(seq.seq_id)
            self._end(seq, [], outbox)
        self._publish_stats()
        self._deliver(outbox)

    def _publish_stats(self) -> None:
        stats = engine_stats(self._counters, self.scheduler, self.kv, self.arena, self.fixed_resident_bytes)
        with self._lock:
            self._stats = stats

    # -- telemetry (any thread) ----------------------------------------------
    def drain_routing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(routed_tokens int64, prob_mass float64) [layers, experts] since the last drain.

        One consumer only (the telemetry client): a drain resets the window.
        """
        return self.routing_window.drain()

    def running_demand(self) -> torch.Tensor:
        """Sum over running sequences of their decayed mean routing, [layers, experts]."""
        return self.demand.running_demand()
