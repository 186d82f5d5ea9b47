"""Token log-probabilities in OpenAI's two response shapes: chat's
`{"content": [{token, logprob, bytes, top_logprobs}]}` and the legacy text
completion's parallel lists `{tokens, token_logprobs, top_logprobs,
text_offset}`.

A token's text is its own decoding (special tokens included), so a token
holding part of a multi-byte character reads as U+FFFD, as in vLLM; `bytes`
are that text's UTF-8. JSON has no -inf: a log-probability below
`LOGPROB_FLOOR` is reported as the floor.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from gateway.sequence import TokenLogprob
from gateway.tokenizer import TextTokenizer

LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _top(token_id: int, logprob: float, tokenizer: TextTokenizer) -> TopLogprob:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8")))


def chat_logprobs(entries: Sequence[TokenLogprob], tokenizer: TextTokenizer) -> ChatLogprobs:
    content = []
    for entry in entries:
        token = _top(entry.token_id, entry.logprob, tokenizer)
        alternatives = [_top(token_id, logprob, tokenizer) for token_id, logprob in entry.top]
        content.append(ChatTokenLogprob(**token.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: Sequence[TokenLogprob], tokenizer: TextTokenizer, text_offset: int
) -> tuple[CompletionLogprobs, int]:
    """The entries' logprobs with offsets counted from `text_offset` (where
    the first token's text starts in the choice's text), and the offset after
    the last token (the next chunk's start)."""
    logprobs = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for entry in entries:
        text = tokenizer.decode([entry.token_id], skip_special_tokens=False)
        logprobs.tokens.append(text)
        logprobs.token_logprobs.append(_finite(entry.logprob))
        logprobs.top_logprobs.append(
            {tokenizer.decode([token_id], skip_special_tokens=False): _finite(value) for token_id, value in entry.top}
        )
        logprobs.text_offset.append(text_offset)
        text_offset += len(text)
    return logprobs, text_offset
