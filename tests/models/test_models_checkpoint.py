"""The committed pw-moe-tiny folder: layout, size limits, report contents, and
that the weights are trained (no dataplane involved)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
MAX_WEIGHT_BYTES = 25_000_000
GROUP = 128
PY_SNIPPET = '''import os
import sys


def main(argv=None):
    """Print the names of the files in a directory."""
    if argv is None:
        argv = sys.argv[1:]
    for name in sorted(os.listdir(argv[0] if argv else ".")):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def test_folder_layout_and_weight_names() -> None:
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["model_type"] == "mixtral" and cfg["num_local_experts"] == 8 and cfg["num_experts_per_tok"] == 2
    assert cfg["hidden_size"] % GROUP == 0 and cfg["intermediate_size"] % GROUP == 0
    assert cfg["tie_word_embeddings"] is True and cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == 2
    index = json.loads((MODEL / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert sum((MODEL / s).stat().st_size for s in shards) <= MAX_WEIGHT_BYTES
    names = set()
    for shard in shards:
        assert (MODEL / shard).stat().st_size < 16 * 2**20
        with safe_open(str(MODEL / shard), "pt") as f:
            for key in f.keys():
                assert index["weight_map"][key] == shard
                assert f.get_slice(key).get_dtype() == "BF16"
                names.add(key)
    assert names == set(index["weight_map"])
    layers, experts = cfg["num_hidden_layers"], cfg["num_local_experts"]
    expected_experts = {f"model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight"
                        for l in range(layers) for e in range(experts) for w in ("w1", "w2", "w3")}
    assert expected_experts <= names and "lm_head.weight" not in names


def test_report_has_the_required_numbers() -> None:
    report = json.loads((MODEL / "report.json").read_text())
    assert not report["partial"]
    domains = list(report["quality"])
    assert len(domains) >= 3
    for d in domains:
        for split in ("validation", "test"):
            m = report["quality"][d][split]
            assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-3) and m["bits_per_byte"] > 0
    usage = report["expert_usage"]
    assert len(usage["js_divergence_bits"]) == len(domains) * (len(domains) - 1) // 2
    assert set(report["rtn"]["bits"]) == {"8", "6", "4", "3", "2"}
    for d in domains:
        four_bit = report["rtn"]["bits"]["4"]["quality"][d]["test"]["ppl_increase_pct"]
        two_bit = report["rtn"]["bits"]["2"]["quality"][d]["test"]["ppl_increase_pct"]
        assert 0 < four_bit < two_bit  # 4 bits already costs quality, 2 bits far more
    assert "Commit:" in (MODEL / "REPORT.md").read_text()


def test_weights_are_trained() -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(MODEL))
    model = transformers.MixtralForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    ids = tok(PY_SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    assert loss < 2.5, f"loss {loss:.3f} nats/token: not a trained model (random is ~{math.log(8192):.1f})"
