"""Token log-probabilities in OpenAI's two response shapes: chat's
`{"content": [{token, logprob, bytes, top_logprobs}]}` and the legacy text
completion's parallel lists `{tokens, token_logprobs, top_logprobs,
text_offset}`.

A token's text is its own decoding, so a token holding part of a multi-byte
character reads as U+FFFD, as in vLLM; `bytes` are that text's UTF-8. The
sequence's own tokens decode as its text does (special tokens such as an
added BOS are empty, so `text_offset` matches the text); alternatives decode
with special tokens shown (an end-of-sequence alternative reads as itself).
JSON has no -inf: a log-probability below `LOGPROB_FLOOR` is reported as the
floor.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.protocol import CompletionLogprobs
from gateway.protocol_chat import ChatLogprobs, ChatTokenLogprob, TopLogprob
from gateway.sequence import TokenLogprob
from gateway.tokenizer import TextTokenizer

LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _own_text(token_id: int, tokenizer: TextTokenizer) -> str:
    return tokenizer.decode([token_id])


def _alternative_text(token_id: int, tokenizer: TextTokenizer) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top(text: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8")))


def chat_logprobs(entries: Sequence[TokenLogprob], tokenizer: TextTokenizer) -> ChatLogprobs:
    content = []
    for entry in entries:
        token = _top(_own_text(entry.token_id, tokenizer), entry.logprob)
        alternatives = [_top(_alternative_text(token_id, tokenizer), logprob) for token_id, logprob in entry.top]
        content.append(ChatTokenLogprob(**token.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: Sequence[TokenLogprob], tokenizer: TextTokenizer, text_offset: int, first_token: int | None = None
) -> tuple[CompletionLogprobs, int]:
    """The entries' logprobs with offsets counted from `text_offset` (where
    the first token's text starts in the choice's text), and the offset after
    the last token (the next chunk's start). `first_token`: a prompt's first
    token (echo), put before the entries with no log-probability, as OpenAI
    does: nothing precedes it."""
    logprobs = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])

    def add(token_id: int, value: float | None, top: dict[str, float] | None) -> None:
        nonlocal text_offset
        text = _own_text(token_id, tokenizer)
        logprobs.tokens.append(text)
        logprobs.token_logprobs.append(value)
        logprobs.top_logprobs.append(top)
        logprobs.text_offset.append(text_offset)
        text_offset += len(text)

    if first_token is not None:
        add(first_token, None, None)
    for entry in entries:
        top = {_alternative_text(token_id, tokenizer): _finite(value) for token_id, value in entry.top}
        add(entry.token_id, _finite(entry.logprob), top)
    return logprobs, text_offset
