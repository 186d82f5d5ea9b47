"""Writes a small random Mixtral checkpoint in Hugging Face layout.

The folder holds config.json, generation_config.json, sharded safetensors with
model.safetensors.index.json, a byte-level BPE tokenizer.json (trained on the
module docstrings of Python's standard library: deterministic, no download),
and tokenizer_config.json with a chat template over the special tokens
<|system|>, <|user|>, <|assistant|> and <|end|> (the eos token).

    python tools/make_random_checkpoint.py OUT_DIR [--hidden-size 128 ...]

Importable: ``make_random_checkpoint(path, **sizes)``. Hidden and FFN sizes
must be multiples of 128 (the weight quantiser's group size).
"""

from __future__ import annotations

import argparse
import ast
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

GROUP_SIZE = 128
INIT_STD = 0.02
BOS = "<|begin|>"
EOS = "<|end|>"
SPECIAL_TOKENS = (BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Enough text for the merges of a small vocabulary; parsing more only costs time.
MAX_CORPUS_CHARS = 150_000


def stdlib_docstrings(max_chars: int = MAX_CORPUS_CHARS) -> Iterator[str]:
    """Docstrings of the top-level stdlib modules, in sorted file order.

    Parsed with ``ast`` (never imported: some modules have side effects);
    stops after ``max_chars`` characters.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc
                    total += len(doc)
        if total >= max_chars:
            return


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer with the special tokens first (ids 0..4)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_docstrings(), trainer)
    return tokenizer


def random_tensors(
    *, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, experts: int, vocab: int, tie: bool, seed: int
) -> dict[str, torch.Tensor]:
    """Hugging Face-named Mixtral tensors ~ N(0, INIT_STD), norms = 1 (float32)."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * INIT_STD

    out = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    if not tie:
        out["lm_head.weight"] = rand(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = torch.ones(hidden)
        out[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden)
        out[f"{p}.self_attn.q_proj.weight"] = rand(heads * head_dim, hidden)
        out[f"{p}.self_attn.k_proj.weight"] = rand(kv_heads * head_dim, hidden)
        out[f"{p}.self_attn.v_proj.weight"] = rand(kv_heads * head_dim, hidden)
        out[f"{p}.self_attn.o_proj.weight"] = rand(hidden, heads * head_dim)
        out[f"{p}.block_sparse_moe.gate.weight"] = rand(experts, hidden)
        for e in range(experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            out[f"{q}.w1.weight"] = rand(ffn, hidden)
            out[f"{q}.w3.weight"] = rand(ffn, hidden)
            out[f"{q}.w2.weight"] = rand(hidden, ffn)
    return out


def write_shards(path: Path, tensors: dict[str, torch.Tensor], num_shards: int) -> None:
    """Splits tensors (in name order) into ~equal-byte shards plus the index."""
    names = sorted(tensors)
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    per_shard = -(-total // num_shards)
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if size + nbytes > per_shard and groups[-1] and len(groups) < num_shards:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, str(path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_random_checkpoint(
    path: str | Path,
    *,
    hidden_size: int = 128,
    intermediate_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    vocab_size: int = 512,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    num_shards: int = 2,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Path:
    """Writes the checkpoint into ``path`` (created) and returns it."""
    for name, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
        if value % GROUP_SIZE:
            raise ValueError(f"{name} must be a multiple of {GROUP_SIZE}, got {value}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size % num_heads and num_heads % num_kv_heads must be 0")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    vocab = tokenizer.get_vocab_size()  # may be below vocab_size on a small corpus
    tokenizer.save(str(out / "tokenizer.json"))
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    tensors = random_tensors(
        hidden=hidden_size,
        ffn=intermediate_size,
        layers=num_layers,
        heads=num_heads,
        kv_heads=num_kv_heads,
        experts=num_experts,
        vocab=vocab,
        tie=tie_word_embeddings,
        seed=seed,
    )
    write_shards(out, {k: v.to(dtype) for k, v in tensors.items()}, num_shards)
    dtype_name = str(dtype).removeprefix("torch.")
    config = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": vocab,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "num_local_experts": num_experts,
        "num_experts_per_tok": top_k,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "sliding_window": None,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype_name,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": bos_id, "eos_token_id": [eos_id]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--num-experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--max-position-embeddings", type=int, default=1024)
    parser.add_argument("--num-shards", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = make_random_checkpoint(
        args.path,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        num_experts=args.num_experts,
        top_k=args.top_k,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        num_shards=args.num_shards,
        dtype=getattr(torch, args.dtype),
        seed=args.seed,
    )
    print(out)


if __name__ == "__main__":
    main()
