"""Per-request sampling parameters (the engine's copy of inference.proto's)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

from dataplane.logprobs import MAX_TOP_LOGPROBS

# OpenAI's bound on presence_penalty and frequency_penalty.
MAX_PENALTY = 2.0
# OpenAI's bounds on logit_bias: the size of one bias and the tokens biased.
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 300


@dataclass(frozen=True)
class StructuredOutput:
    """The grammar generated text must follow (dataplane/structured_output.py):
    any JSON object, or the JSON Schema ``schema`` (JSON text)."""

    kind: Literal["json_object", "json_schema"]
    schema: str = ""

    def validate(self) -> None:
        if self.kind == "json_schema":
            try:
                json.loads(self.schema)
            except json.JSONDecodeError as err:
                raise ValueError(f"response_format: the JSON schema is not JSON: {err}") from err
        elif self.kind != "json_object":
            raise ValueError(f"unknown structured output kind {self.kind!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Greedy when temperature is 0."""

    temperature: float = 0.0
    top_p: float = 1.0  # in (0, 1]; 1 disables
    top_k: int = 0  # 0 disables
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Log-probabilities with each generated token and this many alternatives
    # (0..MAX_TOP_LOGPROBS); None: none (dataplane/logprobs.py).
    logprobs: int | None = None
    # The same for the prompt's tokens (each given the ones before it).
    prompt_logprobs: int | None = None
    # Repetition penalties over the generated tokens (dataplane/sampler.py).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before the penalties.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Constrains the text to a grammar (JSON); None: free text.
    structured_output: StructuredOutput | None = None

    def validate(self, vocab_size: int) -> None:
        """Raises ValueError naming the first bad field."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        for name, value in (("presence_penalty", self.presence_penalty),
                            ("frequency_penalty", self.frequency_penalty)):
            if not math.isfinite(value) or abs(value) > MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
        for name, value in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_TOP_LOGPROBS}], got {value}")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"logit_bias may list at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(self.logit_bias)}")
        bad = [t for t, _ in self.logit_bias if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
        for token, bias in self.logit_bias:
            if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias of token {token} must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias}")
        if self.structured_output is not None:
            self.structured_output.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """The pick depends on the tokens generated so far."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def needs_history(self) -> bool:
        """The pick depends on the tokens generated so far (penalties, a grammar)."""
        return self.penalized or self.structured_output is not None

    @property
    def adjusts_logits(self) -> bool:
        """The pick is made from logits changed first (bias, penalties, a
        grammar's mask), so a greedy row's pick is not the plain argmax of the
        model's logits."""
        return self.needs_history or bool(self.logit_bias)
