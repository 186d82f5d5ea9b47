"""The token-level contract of pw-moe-tiny: special tokens, their ids, the chat
template, and the tokenizer_config.json that carries them.

Documents are framed as ``<|bos|> text <|end|>`` in training; a chat turn is
``<|role|>\\n content <|end|>\\n``. ``<|end|>`` is both end of turn and eos.
"""

from __future__ import annotations

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|end|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"

# Order fixes the ids: pad 0, bos 1, eos 2, then the roles.
SPECIAL_TOKENS = (PAD, BOS, EOS, SYSTEM, USER, ASSISTANT)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 512

# bos once; each message as <|role|>\n{content}<|end|>\n; an open assistant turn on request.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('Unknown role: ' + message['role'] + ' (expected system, user or assistant)') -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] | trim + '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def tokenizer_config() -> dict:
    """Contents of tokenizer_config.json (loadable by transformers' AutoTokenizer)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, tok in enumerate(SPECIAL_TOKENS)
        },
    }
