"""Training pieces on tiny sizes (CPU): the sorted experts forward equals
transformers' eager one, and train.py + evaluate.py run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from models.corpus.build_corpus import SPLITS
from models.train.tokenize_corpus import META_FILE, load_stream, stream_path, write_stream

transformers = pytest.importorskip("transformers")

TINY_MODEL = {
    "vocab_size": 64, "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "num_local_experts": 4,
    "num_experts_per_tok": 2, "max_position_embeddings": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True, "router_aux_loss_coef": 0.04, "initializer_range": 0.02,
}
TINY_TRAIN = {
    "steps": 8, "warmup_steps": 3, "batch_sequences": 4, "seq_len": 16, "peak_lr": 0.003, "min_lr_ratio": 0.1,
    "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "eval_every": 4, "eval_max_windows": 2,
    "log_every": 4, "max_train_seconds": 600, "calibrate_steps": 2, "save_dtype": "bfloat16",
    "max_shard_size": "100KB",
}


def _tiny_mixtral(impl: str):
    cfg = transformers.MixtralConfig(**{k: v for k, v in TINY_MODEL.items() if k != "rope_theta"})
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM._from_config(cfg, experts_implementation=impl)


def test_sorted_experts_equal_eager_forward_and_grads() -> None:
    from models.train.sorted_experts import register_sorted_experts

    fast = _tiny_mixtral(register_sorted_experts())
    ref = _tiny_mixtral("eager")
    ref.load_state_dict(fast.state_dict())
    ids = torch.randint(0, 64, (3, 20))
    out_fast, out_ref = fast(input_ids=ids), ref(input_ids=ids)
    torch.testing.assert_close(out_fast.logits, out_ref.logits, rtol=1e-5, atol=1e-5)
    out_fast.logits.square().mean().backward()
    out_ref.logits.square().mean().backward()
    for (name, a), (_, b) in zip(fast.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def _fake_tokens(root: Path, domains: list[str]) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    meta = {"vocab_size": 64, "bos_id": 1, "eos_id": 2, "tokenizer_sha256": "fake", "domains": {}}
    for i, domain in enumerate(domains):
        meta["domains"][domain] = {}
        for split in SPLITS:
            # each domain prefers its own token range, so the model has something to learn
            body = rng.integers(6 + 20 * i, 26 + 20 * i, size=400 if split == "train" else 120)
            stream = np.concatenate([[1], body, [2]]).astype(np.uint16)
            sha = write_stream(stream, stream_path(root, domain, split))
            meta["domains"][domain][split] = {"documents": 1, "tokens": int(stream.size),
                                              "text_bytes": 3 * int(stream.size), "sha256": sha}
    (root / META_FILE).write_text(json.dumps(meta))
    return root


def test_train_and_evaluate_end_to_end(tmp_path: Path) -> None:
    from models.train import evaluate, train

    domains = ["alpha", "beta"]
    tokens = _fake_tokens(tmp_path / "tokens", domains)
    assert load_stream(tokens, "alpha", "test")[0] == 1
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"name": "tiny", "seed": 3, "domains": domains, "model": TINY_MODEL,
                                  "train": TINY_TRAIN}))
    out = tmp_path / "model"
    train.main(["--config", str(config), "--tokens", str(tokens), "--out", str(out), "--device", "cpu"])
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps_run"] == 8 and len(log["evals"]) == 2
    assert log["evals"][-1]["mean"] < log["evals"][0]["mean"] < np.log(64)  # it learns
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["dtype"] == "bfloat16" and hf_cfg["num_local_experts"] == 4
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in index["weight_map"]

    report_path = tmp_path / "report.json"
    evaluate.main(["--model", str(out), "--tokens", str(tokens), "--out", str(report_path), "--seq-len", "16",
                   "--batch", "4", "--device", "cpu"])
    report = json.loads(report_path.read_text())
    assert report["model"] == "tiny" and not report["partial"]
    for domain in domains:
        for split in ("validation", "test"):
            m = report["quality"][domain][split]
            assert m["perplexity"] == pytest.approx(np.exp(m["loss"]), rel=1e-3)
            assert m["bits_per_byte"] == pytest.approx(m["loss"] * m["tokens"] / (3 * 122) / np.log(2), rel=1e-3)
    assert set(report["rtn"]["bits"]) == {"8", "6", "4", "3", "2"}
    errors = [report["rtn"]["bits"][b]["mean_relative_weight_error"] for b in ("8", "6", "4", "3", "2")]
    assert errors == sorted(errors)
    fractions = report["expert_usage"]["per_domain"]["alpha"]["fractions"]
    assert len(fractions) == 2 and all(sum(row) == pytest.approx(1.0, abs=1e-4) for row in fractions)
