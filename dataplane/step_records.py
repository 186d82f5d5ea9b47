"""The records of one model step between ``ModelRunner.launch`` and
``ModelRunner.collect`` (dataplane/runner.py): what is queued on the device,
and what the step produced once collected (host data only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dataplane.logprobs import StepLogprobs, TokenLogprobs
from dataplane.routing_stats import RoutingStats
from dataplane.scheduler import ScheduledSeq


@dataclass
class StepResult:
    """What one forward step produced (host data only)."""

    sampled: dict[str, int]  # seq_id -> next token, for sequences that sampled
    routed_tokens: torch.Tensor  # [layers, experts] int64
    prob_mass: torch.Tensor  # [layers, experts] float32
    seq_prob_sum: torch.Tensor  # [B, layers, experts] float32, scheduled order
    num_tokens: int
    # seq_id -> its new token's log-probabilities, for sequences that sampled and asked
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # seq_id -> (first, entries of prompt tokens first + 1, ...), for sequences
    # that asked for prompt logprobs and prefilled prompt positions this step
    prompt_logprobs: dict[str, list[tuple[int, list[TokenLogprobs]]]] = field(default_factory=dict)
    host_only: tuple[frozenset[int], ...] = ()  # LaunchedStep.host_only


@dataclass(frozen=True)
class HostStats:
    """Host copies of a step's routing statistics, queued on the device stream.

    On CUDA they land in pinned memory once the stream reaches them: read
    them only after the step's collect.
    """

    routed_tokens: torch.Tensor  # [layers, experts] int64
    prob_mass: torch.Tensor  # [layers, experts] float32
    seq_prob_sum: torch.Tensor  # [B, layers, experts] float32, scheduled order

    @classmethod
    def start(cls, routing: RoutingStats, batch: int) -> "HostStats":
        # One copy of the recorder's buffer (the three sums and any padding
        # rows: a few KB), then views of it.
        routed, mass, seq = routing.views(start_host_copy(routing.buffer))
        return cls(routed_tokens=routed, prob_mass=mass, seq_prob_sum=seq[:batch])


@dataclass(frozen=True)
class DevicePicks:
    """Next tokens of a graph step, sampled on the device at launch."""

    ids: torch.Tensor  # [B] int64 on the device, scheduled order (input of a step launched ahead)
    host: torch.Tensor  # [B] int64 host copy (pinned on CUDA), valid after ``done``
    done: torch.cuda.Event | None  # recorded after the step's host copies; None off CUDA
    logprobs: StepLogprobs | None = None  # host copies (rows: scheduled order), valid after ``done``


@dataclass(frozen=True)
class PromptLogprobs:
    """Device log-probabilities of prompt tokens first + 1, first + 2, ... of one sequence."""

    seq_id: str
    first: int
    values: StepLogprobs


@dataclass(frozen=True)
class LaunchedStep:
    """A step whose device work is queued (``ModelRunner.launch``); ``collect`` finishes it."""

    scheduled: list[ScheduledSeq]
    # [S, vocab] rows of the sampling sequences (scheduled order): float32, or
    # the model's dtype from a graph replay
    logits: torch.Tensor | None
    stats: HostStats
    num_tokens: int
    picks: DevicePicks | None = None  # set when every row was sampled at launch (graph steps)
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)  # eager steps only
    # each weight store's host-only blocks as the step was queued (the ones it read from the host)
    host_only: tuple[frozenset[int], ...] = ()


def start_host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t``; from a CUDA tensor it lands in pinned memory once the stream reaches it."""
    if not t.is_cuda:
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out
