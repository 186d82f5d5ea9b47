"""Structured output: the generated text kept inside a JSON grammar.

A request's `StructuredOutput` (any JSON object, or a JSON Schema) is
compiled by xgrammar against the model's tokenizer; each sequence gets a
`TokenGrammar`, the grammar's state after its tokens so far. Before every
pick the sampler masks the tokens the grammar forbids (`TokenGrammar.mask`);
the scheduler feeds the picked token back (`accept`) and ends the sequence
when the grammar is complete (its stop token accepted). The mask needs the
previous token on the host, so such a batch is never launched ahead.

Whitespace between JSON tokens is not free: a small model left free to emit
whitespace can loop on it until max_tokens, so the grammar takes the compact
form (one space after ':' and ',', as Python's json.dumps writes).

xgrammar (and transformers, which it reads the tokenizer through) are
imported on the first structured request, not with the engine: a dataplane
that never gets one does not load them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer

from dataplane.sampling_params import StructuredOutput

if TYPE_CHECKING:
    import xgrammar as xgr


def _xgrammar():
    import xgrammar

    return xgrammar


class TokenGrammar:
    """One sequence's grammar state. Engine thread only (not thread-safe)."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._xgr = _xgrammar()
        self._matcher = self._xgr.GrammarMatcher(compiled)
        self._vocab_size = vocab_size
        self._bitmask = self._xgr.allocate_token_bitmask(1, vocab_size)  # [1, ceil(V / 32)] int32, on the host

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] float32 -> a new [V] float32 with the tokens the grammar
        forbids next at -inf (``logits`` is left as it is)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        # xgrammar's contract is a batch: logits [rows, V] and bitmask [rows, ceil(V / 32)] on one
        # device. Its CPU path accepts a 1-D row; its CUDA path (a Triton kernel) takes a row's
        # width from bitmask.stride(0), 1 for a 1-D bitmask, so it read one word and masked every
        # token past the first 32 (grammar rows picked token 0 on the H200 in session 38).
        masked = logits.clone().unsqueeze(0)  # [1, V]
        self._xgr.apply_token_bitmask_inplace(masked, self._bitmask.to(masked.device), vocab_size=self._vocab_size)
        return masked[0]

    def accept(self, token: int) -> bool:
        """Advances past ``token``; False when the grammar forbids it (state unchanged)."""
        return self._matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        """The text is complete and its stop token was accepted."""
        return self._matcher.is_terminated()


class GrammarBackend:
    """Compiles structured-output requests for one model (thread-safe).

    The tokenizer's vocabulary is analysed once, on the first request that
    asks for structured output; compiled grammars are cached by xgrammar.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self._tokenizer_json = tokenizer_json
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._lock = threading.Lock()

    def start(self, spec: StructuredOutput | None) -> TokenGrammar | None:
        """A fresh grammar state for ``spec`` (None without one). Raises
        ValueError for a schema the grammar compiler does not accept."""
        if spec is None:
            return None
        with self._lock:
            compiler = self._compiler_locked()
            try:
                if spec.kind == "json_object":
                    compiled = compiler.compile_json_schema({"type": "object"}, any_whitespace=False)
                else:
                    compiled = compiler.compile_json_schema(spec.schema, any_whitespace=False)
            except (RuntimeError, ValueError, TypeError) as err:
                raise ValueError(f"response_format: the JSON schema cannot be compiled: {err}") from err
        return TokenGrammar(compiled, self._vocab_size)

    def _compiler_locked(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            if not self._tokenizer_json:
                raise ValueError("structured output needs the model's tokenizer; this model has none")
            xgr = _xgrammar()
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(self._tokenizer_json))
            info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler
