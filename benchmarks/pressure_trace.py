"""The per-iteration trace of benchmarks/memory_pressure.py's cases: what
the engine loop did each iteration (expert bits, running requests, tokens,
the precision controller's time, graph replays, host-only block reads), recorded by a
wrapper around the engine's ``before_step`` hook on the engine thread."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dataplane.kernel_compiles import CompileWatch


@dataclass
class StepTrace:
    """Per engine-loop iteration, recorded on the engine thread (after the controller ran)."""

    mean_bits: list[float] = field(default_factory=list)  # over expert weights
    started_at: list[float] = field(default_factory=list)  # perf_counter when the iteration's hook ran
    controller_s: list[float] = field(default_factory=list)  # seconds in the precision controller's hook
    running: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)  # tokens generated before this iteration (engine total)
    state_ids: list[int] = field(default_factory=list)  # index into states of this iteration's block bits
    states: list[list[int]] = field(default_factory=list)  # distinct block bits, in order of appearance
    # Graph replays and reads of host-only blocks before this iteration (engine and store totals):
    # a decode step that did not replay ran eagerly (a batch over the largest bucket).
    replays: list[int] = field(default_factory=list)
    host_reads: list[int] = field(default_factory=list)
    # (iteration, kernel name) of each Triton kernel variant compiled (or loaded from the disk cache:
    # a miss of the in-memory cache) while the trace ran; the iteration is the one in progress.
    compiled: list[tuple[int, str]] = field(default_factory=list)

    def clear(self) -> None:
        for values in (self.mean_bits, self.started_at, self.controller_s, self.running, self.generated,
                       self.state_ids, self.states, self.replays, self.host_reads, self.compiled):
            values.clear()

    def iteration_seconds(self, end: float) -> list[float]:
        """Each iteration's wall time: until the next one's hook (the last: until ``end``)."""
        return [b - a for a, b in zip(self.started_at, [*self.started_at[1:], end])]

    def deepest_state(self) -> list[int]:
        """Every block's bits at the iteration with the lowest mean bits."""
        return self.states[self.state_ids[self.mean_bits.index(min(self.mean_bits))]]

    def served_states(self, generated_end: int, count: int) -> list[list[int]]:
        """``count`` states at the token quantiles (k + 1/2) / count of the tokens generated
        over the trace: each iteration's state is weighted by the tokens that came out
        between it and the next iteration (the last: until ``generated_end``)."""
        bounds = [*self.generated[1:], generated_end]
        weights = [max(0, b - a) for a, b in zip(self.generated, bounds)]  # [iterations]
        total = sum(weights)
        if total == 0:
            return [self.deepest_state()] * count
        picked, cumulative, i = [], 0, -1
        for k in range(count):
            target = (k + 0.5) / count * total
            while cumulative <= target:
                i += 1
                cumulative += weights[i]
            picked.append(self.states[self.state_ids[i]])
        return picked


def trace_steps(engine, store) -> StepTrace:
    """Wraps the engine's before_step so each iteration records the expert bits, the
    running requests and the tokens generated so far."""
    weights = [rows * cols for rows, cols in (store.shape(b) for b in range(store.num_blocks))]
    total = sum(weights)
    trace = StepTrace()
    inner = engine.before_step

    def before_step() -> None:
        start = time.perf_counter()
        if inner is not None:
            inner()
        trace.started_at.append(start)
        trace.controller_s.append(time.perf_counter() - start)
        bits = store.block_bits()
        if not trace.states or trace.states[-1] != bits:
            trace.states.append(bits)
        trace.state_ids.append(len(trace.states) - 1)
        trace.mean_bits.append(sum(w * b for w, b in zip(weights, bits)) / total)
        trace.running.append(len(engine.scheduler.running))
        trace.generated.append(engine.stats().generated_tokens_total)
        trace.replays.append(engine.runner.graphs.replays if engine.runner.graphs is not None else 0)
        trace.host_reads.append(store.counters.host_reads)

    engine.before_step = before_step
    _record_compiles(trace)
    return trace


def _record_compiles(trace: StepTrace) -> None:
    """Records each Triton kernel variant compiled into ``trace.compiled``, through the dataplane's own
    watch (dataplane/kernel_compiles.py; this benchmark process only, never removed)."""
    CompileWatch(lambda name: trace.compiled.append((len(trace.started_at) - 1, name))).install()
