"""The project's trained default model (models/pw-moe-tiny): transformers'
MixtralForCausalLM loaded from the folder and the dataplane give the same
logits and the same greedy tokens."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from transformers import MixtralForCausalLM

from dataplane.checkpoint import Checkpoint
from dataplane.config import DataplaneConfig
from dataplane.kv_cache import KVCacheManager, kv_block_bytes
from dataplane.memory.arena import Arena
from dataplane.models.registry import build_model
from dataplane.runner import ModelRunner
from dataplane.sampler import Sampler
from dataplane.scheduler import ScheduledSeq
from dataplane.sequence import Sequence
from dataplane.engine_builder import build_engine
from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams
from launcher.processes import REPO_ROOT

MODEL = REPO_ROOT / "models" / "pw-moe-tiny"
PROMPTS = [
    "def fibonacci(n):\n    ",
    "#include <stdio.h>\n\nint main(void)\n{",
    "The tutorial explains how to",
    "Die Option gibt an, dass",
]
NEW_TOKENS = 24
ATOL = 1e-3  # float32 on both sides; different summation orders
RTOL = 1e-3
KV_BLOCK = 4  # small blocks so the decode steps cross block boundaries


@pytest.fixture(scope="module")
def peer() -> MixtralForCausalLM:
    return MixtralForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


@pytest.fixture(scope="module")
def engine():
    engine = build_engine(DataplaneConfig(model_path=str(MODEL), device="cpu", dtype="float32", expert_precision="dense"))
    engine.start()
    yield engine
    engine.stop()


def greedy_dataplane(engine, prompt: list[int]) -> list[int]:
    sink = QueueSink()
    engine.add_request(f"p{hash(tuple(prompt))}", prompt, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), sink)
    return [t for out in sink.outputs(timeout=120) for t in out.new_token_ids]


def test_same_greedy_tokens_as_transformers(peer, tokenizer, engine):
    for text in PROMPTS:
        prompt = tokenizer.encode(text).ids
        with torch.no_grad():
            want = peer.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )[0, len(prompt):].tolist()
        assert greedy_dataplane(engine, prompt) == want, text


def test_same_logits_as_transformers(peer, tokenizer):
    """Prefill of half the prompt, then decode steps through the paged KV cache."""
    ckpt = Checkpoint(MODEL)
    spec = ckpt.spec
    model = build_model(spec, torch.device("cpu"), torch.float32)
    model.load_weights(ckpt.iter_tensors(progress=False))
    page = kv_block_bytes(KV_BLOCK, spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.float32)
    kv = KVCacheManager(Arena(16, page), KV_BLOCK, spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.float32)
    runner = ModelRunner(model.eval(), kv, spec.num_layers, spec.num_experts, torch.device("cpu"), None, Sampler())
    prompt = tokenizer.encode(PROMPTS[0] + "return n").ids
    with torch.no_grad():
        want = peer(torch.tensor([prompt])).logits[0]
    seq = Sequence("s", prompt, SamplingParams(), arrival=0)
    half = len(prompt) // 2
    steps = [(0, half)] + [(pos, 1) for pos in range(half, len(prompt))]
    for start, n in steps:
        kv.allocate("s", start + n)
        input_ids, positions, ctx = runner.prepare([ScheduledSeq(seq, start, n)])
        with torch.inference_mode():
            got = model.compute_logits(model(input_ids, positions, ctx))
        torch.testing.assert_close(got, want[start : start + n], atol=ATOL, rtol=RTOL, msg=f"position {start}")
