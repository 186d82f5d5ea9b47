"""Token ids -> text, incrementally, and stop-string matching on that text.

Two small state machines, one per generated sequence:

* `IncrementalDetokenizer` turns token ids into text as they arrive and never
  emits a broken character: byte-level BPE spreads one UTF-8 character over
  several tokens, and the decoded text of an incomplete character ends in
  U+FFFD, so such text is held back until the character is complete. It
  decodes a short window (the previously emitted tokens plus the new ones) so
  tokenizers whose decoding depends on the neighbour (leading-space rules)
  come out right, at O(window) cost per step.
* `StopStringMatcher` cuts the text before the first completed stop string
  and, until then, holds back any tail that could still become the start of a stop
  string, so a stop string split across tokens is never partly emitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.tokenizer import TextTokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Contract: the concatenation of everything `push` and `flush` return
    equals `tokenizer.decode(context + pushed)` less its first
    `len(tokenizer.decode(context))` characters, for tokenizers whose decoding
    is prefix-stable (byte-level BPE, SentencePiece), and every returned piece
    ends on a character boundary (except `flush`, which may end in U+FFFD for
    a sequence cut inside a character)."""

    def __init__(self, tokenizer: TextTokenizer, context: Sequence[int] = ()) -> None:
        """`context`: tokens that precede the first pushed one in the text
        (e.g. the end of a prompt being continued); they shape how the first
        new tokens decode (a leading space) but are never returned."""
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context)
        # Window start: decoding from here gives the context for new text.
        self._prefix_offset = 0
        # Tokens before this index have been emitted as text (or were context).
        self._read_offset = len(self._ids)

    def push(self, token_ids: Iterable[int]) -> str:
        """Adds tokens; returns the text that became final (may be "")."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Returns the text still held back; call once, when the sequence ends."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if not final and full_text.endswith(REPLACEMENT_CHAR):
            return ""  # the last character is still incomplete
        if len(full_text) <= len(prefix_text):
            # Only tokens that decode to nothing (e.g. skipped special tokens).
            # Stay on the old window so its context is kept.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]


class StopStringMatcher:
    """Contract: `push` returns (text safe to emit, matched). Once matched, the
    emitted text is everything before the stop string that was completed
    first, whatever the split into pushes, and later pushes are errors. Text that could be the start of a stop string is held
    until it is disproved or the sequence ends (`flush`)."""

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._pending = ""
        self.matched = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.matched:
            raise RuntimeError("push after a stop string matched")
        if not self._stops:
            return text, False
        self._pending += text
        cut = self._earliest_match()
        if cut is not None:
            self.matched = True
            emitted, self._pending = self._pending[:cut], ""
            return emitted, True
        keep = self._partial_match_length()
        split = len(self._pending) - keep
        emitted, self._pending = self._pending[:split], self._pending[split:]
        return emitted, False

    def flush(self) -> str:
        """The held-back tail: at the end of a sequence it can no longer match."""
        held, self._pending = self._pending, ""
        return held

    def _earliest_match(self) -> int | None:
        """Start of the stop string that is completed first (smallest end;
        on a tie the longer one). This is what token-by-token streaming sees,
        so the cut does not depend on how the text was split into pushes."""
        found = []
        for stop in self._stops:
            start = self._pending.find(stop)
            if start >= 0:
                found.append((start + len(stop), start))
        return min(found)[1] if found else None

    def _partial_match_length(self) -> int:
        """Length of the longest tail of the pending text that is a proper
        prefix of some stop string (0 when none)."""
        for length in range(min(len(self._pending), self._longest - 1), 0, -1):
            tail = self._pending[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0
