"""One request as the scheduler sees it: tokens, progress, and how it ended."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dataplane.logprobs import TokenLogprobs
from dataplane.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token or end-of-sequence was generated
    LENGTH = "length"  # max_tokens or the context length was reached
    ABORT = "abort"  # cancelled by the client, or the engine could not hold it


class GrammarState(Protocol):
    """Where a sequence is in its structured-output grammar
    (dataplane/structured_output.py's TokenGrammar)."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """[V] float32 logits -> a new [V] with the forbidden next tokens at -inf."""
        ...

    def accept(self, token: int) -> bool:
        """Advances past ``token``; False when the grammar forbids it."""
        ...

    @property
    def terminated(self) -> bool:
        """The text is complete (its stop token accepted)."""
        ...


@dataclass(eq=False)
class Sequence:
    """A request's state. Owned by the engine thread; not thread-safe.

    ``num_computed_tokens`` counts the tokens whose K/V are in the cache. A
    preempted sequence drops its cache (back to 0) and recomputes its prompt
    and its generated tokens as one prefill.
    """

    seq_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival: int  # admission order: lower runs first and is preempted last
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # The request's own random stream (seeded sampling is reproducible even
    # across preemption); created by the sampler on first use.
    generator: torch.Generator | None = None
    # With sampling.structured_output: the grammar's state after the output
    # tokens (a preemption keeps it: the tokens are kept too).
    grammar: GrammarState | None = None
    # With sampling.prompt_logprobs: entry j is prompt token j + 1's, filled
    # as prefill chunks compute them (a recompute after preemption adds
    # nothing twice); handed out once, with the first output.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # Prompt tokens whose K/V came from the prefix cache when it was
    # admitted (the last admission before its first token).
    num_cached_prompt_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids at positions start..end-1 (prompt then output)."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    def add_prompt_logprobs(self, first: int, entries: list[TokenLogprobs]) -> None:
        """Records the entries of prompt tokens first + 1, first + 2, ...;
        those already recorded are skipped. Raises ValueError on a gap."""
        have = len(self.prompt_logprobs)
        if first > have:
            raise ValueError(f"prompt logprobs from position {first} but only {have} recorded")
        self.prompt_logprobs.extend(entries[have - first :])

    def take_prompt_logprobs(self) -> list[TokenLogprobs]:
        """The prompt's entries the first time they are complete, else []."""
        if self.prompt_logprobs_sent or self.sampling.prompt_logprobs is None:
            return []
        if len(self.prompt_logprobs) < self.num_prompt_tokens - 1:
            return []
        self.prompt_logprobs_sent = True
        return self.prompt_logprobs

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
