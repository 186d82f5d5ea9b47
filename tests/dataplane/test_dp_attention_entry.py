"""DataplaneConfig.attention_entry's transform (kernels/attention_entry.py at
decode steps that take the dense GEMV): which layers it sets, that it stays
off the CPU path, and on a GPU that B=1 decode takes it and gives the
tokens of the launches it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dataplane.models.mixtral as mixtral
from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build
from dataplane.engine_io import QueueSink
from dataplane.models.mixtral import ATTENTION_ENTRIES, MixtralAttention
from dataplane.models.synthetic import build_synthetic
from dataplane.sampling_params import SamplingParams

MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
PROMPT = [5, 17, 99, 4, 23, 61, 7]
NEW_TOKENS = 8


def test_config_modes_are_the_model_s():
    field = DataplaneConfig.model_fields["attention_entry"]
    assert set(field.annotation.__args__) == set(ATTENTION_ENTRIES)
    with pytest.raises(ValueError):
        DataplaneConfig(attention_entry="rotary")
    _, model = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=0)
    with pytest.raises(ValueError, match="attention entry"):
        model.use_attention_entry("rotary")


@pytest.mark.parametrize("entry", ATTENTION_ENTRIES)
def test_builder_sets_every_attention_layer(entry):
    model = build(DataplaneConfig(synthetic="mixtral-tiny", device="cpu", attention_entry=entry)).engine.runner.model
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    assert attention and all(a.entry == entry for a in attention)


def test_the_cpu_path_never_takes_it(monkeypatch):
    calls = []
    monkeypatch.setattr(mixtral, "attention_entry", lambda *a, **k: calls.append(a))
    built = build(DataplaneConfig(model_path=str(MODEL), device="cpu", dtype="float32", max_running_seqs=1,
                                  max_context_length=64))
    assert _generate(built.engine, "cpu")
    assert not calls


def _generate(engine, tag: str) -> list[int]:
    engine.start()
    try:
        sink = QueueSink()
        engine.add_request(tag, PROMPT, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), sink)
        return [t for out in sink.outputs(timeout=300) for t in out.new_token_ids]
    finally:
        engine.stop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graphs", [False, True])
def test_gpu_b1_decode_takes_it_and_keeps_the_tokens(monkeypatch, graphs):
    taken = []
    real = mixtral.attention_entry

    def counting(*args, **kwargs):
        taken.append(args[-1] is not None if len(args) > 9 else kwargs.get("norm") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(mixtral, "attention_entry", counting)
    tokens = {}
    for entry in ATTENTION_ENTRIES:
        taken.clear()
        built = build(DataplaneConfig(model_path=str(MODEL), device="cuda", dtype="bfloat16", max_running_seqs=1,
                                      max_context_length=64, max_arena_pages=256, cuda_graphs=graphs,
                                      dynamic_precision=False, attention_entry=entry))
        tokens[entry] = _generate(built.engine, entry)
        if entry == "off":
            assert not taken
        else:
            assert taken and all(norm == (entry == "norm_qkv_rotary") for norm in taken)
    # The q/k/v product, rotation and stores as the launches it replaces; with
    # the norm inside, the normalised row is not rounded to bf16 first.
    assert tokens["qkv_rotary"] == tokens["off"]
    assert tokens["norm_qkv_rotary"] == tokens["off"]
