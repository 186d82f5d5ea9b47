"""Text <-> token ids for the served model, from its tokenizer.json.

The gateway receives tokenizer.json verbatim from the dataplane
(`Inference.GetModelInfo`), so it needs no model folder.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer


class TextTokenizer:
    """Wraps a `tokenizers.Tokenizer`; stateless after construction."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        # A tokenizer.json may carry truncation/padding settings from training;
        # prompts must never be cut or padded silently, so both are turned off.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    @classmethod
    def from_json(cls, tokenizer_json: str) -> TextTokenizer:
        """Raises ValueError when the JSON is not a valid tokenizer."""
        try:
            return cls(Tokenizer.from_str(tokenizer_json))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise ValueError(f"invalid tokenizer.json: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without added special tokens: a rendered chat
        template already contains the BOS/turn tokens it wants."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a plain prompt that the model continues, with the
        special tokens the tokenizer adds itself (e.g. BOS), as Hugging Face
        tokenizers and OpenAI-compatible servers do for text completions."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; incomplete UTF-8 sequences come out as U+FFFD."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)
