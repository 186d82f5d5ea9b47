"""DataplaneConfig.fuse_qkv_rotary's transform (kernels/qkv_rotary_gemv.py at
decode steps that take the dense GEMV): which layers it sets, that the CPU
path never takes it, and on a GPU that B=1 decode takes it and gives the
tokens of the launches it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dataplane.models.mixtral as mixtral
from dataplane.config import DataplaneConfig
from dataplane.engine_builder import build
from dataplane.engine_io import QueueSink
from dataplane.models.mixtral import MixtralAttention
from dataplane.sampling_params import SamplingParams

MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"
PROMPT = [5, 17, 99, 4, 23, 61, 7]
NEW_TOKENS = 8


@pytest.mark.parametrize("on", [False, True])
def test_builder_sets_every_attention_layer(on):
    model = build(DataplaneConfig(synthetic="mixtral-tiny", device="cpu", fuse_qkv_rotary=on)).engine.runner.model
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    assert attention and all(a.rotary_in_gemv == on for a in attention)


def _generate(engine, tag: str) -> list[int]:
    engine.start()
    try:
        sink = QueueSink()
        engine.add_request(tag, PROMPT, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), sink)
        return [t for out in sink.outputs(timeout=300) for t in out.new_token_ids]
    finally:
        engine.stop()


def _counting(monkeypatch) -> list[int]:
    calls = []
    real = mixtral.qkv_rotary_gemv

    def counted(x, *args, **kwargs):
        calls.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(mixtral, "qkv_rotary_gemv", counted)
    return calls


def test_the_cpu_path_never_takes_it(monkeypatch):
    calls = _counting(monkeypatch)
    built = build(DataplaneConfig(model_path=str(MODEL), device="cpu", dtype="float32", max_running_seqs=1,
                                  max_context_length=64, fuse_qkv_rotary=True))
    assert len(_generate(built.engine, "cpu")) == NEW_TOKENS
    assert not calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graphs", [False, True])
def test_gpu_b1_decode_takes_it_and_keeps_the_tokens(monkeypatch, graphs):
    calls = _counting(monkeypatch)
    tokens = {}
    for on in (False, True):
        calls.clear()
        built = build(DataplaneConfig(model_path=str(MODEL), device="cuda", dtype="bfloat16", max_running_seqs=1,
                                      max_context_length=64, max_arena_pages=1024, cuda_graphs=graphs,
                                      dynamic_precision=False, fuse_qkv_rotary=on))
        tokens[on] = _generate(built.engine, f"r{on}")
        assert (len(calls) > 0) == on and set(calls) <= {1}, calls
    assert tokens[True] == tokens[False], tokens
