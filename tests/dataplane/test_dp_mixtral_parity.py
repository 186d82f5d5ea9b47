"""The dataplane's Mixtral matches transformers' MixtralForCausalLM.

A small random checkpoint is written by transformers itself; the dataplane
loads it and runs prefills, chunked prefills and decodes through the paged KV
cache, several sequences of different lengths per step (mixed prefill and
decode in one step), and every logits row must equal the peer's in float32.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from dataplane.checkpoint import Checkpoint, CheckpointError
from dataplane.kv_cache import KVCacheManager, kv_block_bytes
from dataplane.memory.arena import Arena
from dataplane.models.registry import build_model
from dataplane.runner import ModelRunner
from dataplane.sampler import Sampler
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler import ScheduledSeq
from dataplane.sequence import Sequence

ATOL = 2e-5
RTOL = 1e-4
BLOCK_SIZE = 4  # small blocks: sequences span several, some partially


def _hf_checkpoint(path, tie: bool = False, sliding_window: int | None = None):
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=tie,
        sliding_window=sliding_window,
    )
    model = MixtralForCausalLM(config).eval()
    # Larger-than-default weights so routing and attention are far from uniform.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path, max_shard_size="60KB")
    return model


def _load(path, fuse_qkv: bool = False):
    ckpt = Checkpoint(path)
    model = build_model(ckpt.spec, torch.device("cpu"), torch.float32)
    model.load_weights(ckpt.iter_tensors(progress=False))
    if fuse_qkv:
        model.fuse_qkv()
    return ckpt.spec, model.eval()


def _runner(spec, model, num_pages: int = 64) -> ModelRunner:
    page = kv_block_bytes(BLOCK_SIZE, spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.float32)
    arena = Arena(num_pages, page)
    arena.storage.fill_(0xFF)  # stale bytes read as NaN: attention must never use them
    kv = KVCacheManager(arena, BLOCK_SIZE, spec.num_layers, spec.num_kv_heads, spec.head_dim, torch.float32)
    return ModelRunner(model, kv, spec.num_layers, spec.num_experts, torch.device("cpu"), spec.sliding_window, Sampler())


def _step_logits(runner: ModelRunner, items: list[ScheduledSeq]) -> torch.Tensor:
    for item in items:
        runner.kv.allocate(item.seq.seq_id, item.start + item.num_new_tokens)
    input_ids, positions, ctx = runner.prepare(items)
    with torch.inference_mode():
        return runner.model.compute_logits(runner.model(input_ids, positions, ctx))


def _check_against_peer(hf, runner, tokens: dict[str, list[int]], plan: list[list[tuple[str, int]]]) -> None:
    """Runs ``plan`` (per step: (seq, num_new_tokens)) and compares every row."""
    with torch.no_grad():
        want = {sid: hf(torch.tensor([toks])).logits[0] for sid, toks in tokens.items()}
    seqs = {sid: Sequence(sid, toks, SamplingParams(), arrival=i) for i, (sid, toks) in enumerate(tokens.items())}
    done = {sid: 0 for sid in tokens}
    for step in plan:
        items = [ScheduledSeq(seqs[sid], done[sid], n) for sid, n in step]
        got = _step_logits(runner, items)
        row = 0
        for sid, n in step:
            expect = want[sid][done[sid] : done[sid] + n]
            torch.testing.assert_close(got[row : row + n], expect, atol=ATOL, rtol=RTOL, msg=f"{sid} @ {done[sid]}")
            row += n
            done[sid] += n
    assert all(done[sid] == len(toks) for sid, toks in tokens.items())


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_prefill_chunked_prefill_and_decode_match_transformers(tmp_path, fuse_qkv):
    hf = _hf_checkpoint(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()  # sharded
    spec, model = _load(tmp_path, fuse_qkv)
    runner = _runner(spec, model)
    gen = torch.Generator().manual_seed(1)
    lengths = {"a": 9, "b": 17, "c": 4, "d": 12}
    tokens = {sid: torch.randint(0, spec.vocab_size, (n,), generator=gen).tolist() for sid, n in lengths.items()}
    plan = [
        [("a", 6), ("b", 5)],  # two prefills (a complete later, b chunked)
        [("a", 1), ("b", 7), ("c", 3)],  # a decodes while b continues, c starts
        [("a", 1), ("b", 1), ("c", 1), ("d", 12)],  # three decodes + one full prefill
        [("a", 1), ("b", 4)],  # a decode and b's last chunk
    ]
    _check_against_peer(hf, runner, tokens, plan)


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_many_decode_steps_across_block_boundaries(tmp_path, fuse_qkv):
    hf = _hf_checkpoint(tmp_path)
    spec, model = _load(tmp_path, fuse_qkv)
    runner = _runner(spec, model)
    gen = torch.Generator().manual_seed(2)
    tokens = {
        "x": torch.randint(0, spec.vocab_size, (14,), generator=gen).tolist(),
        "y": torch.randint(0, spec.vocab_size, (10,), generator=gen).tolist(),
    }
    plan = [[("x", 5), ("y", 3)]] + [[("x", 1), ("y", 1)] for _ in range(7)] + [[("x", 2)]]
    _check_against_peer(hf, runner, tokens, plan)


def test_tied_embeddings_and_sliding_window(tmp_path):
    hf = _hf_checkpoint(tmp_path, tie=True, sliding_window=5)
    spec, model = _load(tmp_path)
    assert spec.tie_word_embeddings and spec.sliding_window == 5
    runner = _runner(spec, model)
    gen = torch.Generator().manual_seed(3)
    tokens = {"s": torch.randint(0, spec.vocab_size, (13,), generator=gen).tolist()}
    plan = [[("s", 8)]] + [[("s", 1)] for _ in range(5)]
    _check_against_peer(hf, runner, tokens, plan)


def test_fused_expert_names_load_the_same_weights(tmp_path):
    _hf_checkpoint(tmp_path)
    spec, model = _load(tmp_path)
    layer = model.model.layers[1].block_sparse_moe.experts
    gate_up = torch.cat([layer.w1, layer.w3], dim=1)  # [E, 2F, H]
    fused = [
        (name, tensor)
        for name, tensor in model.state_dict().items()
        if ".experts." not in name and ".gate." not in name
    ]
    for i, moe in enumerate(m.block_sparse_moe for m in model.model.layers):
        fused.append((f"model.layers.{i}.mlp.experts.gate_up_proj", torch.cat([moe.experts.w1, moe.experts.w3], 1)))
        fused.append((f"model.layers.{i}.mlp.experts.down_proj", moe.experts.w2.detach().clone()))
        fused.append((f"model.layers.{i}.mlp.gate.weight", moe.gate.weight.detach().clone()))
    other = build_model(spec, torch.device("cpu"), torch.float32)
    other.load_weights(fused)
    other_layer = other.model.layers[1].block_sparse_moe.experts
    torch.testing.assert_close(torch.cat([other_layer.w1, other_layer.w3], dim=1), gate_up)
    torch.testing.assert_close(other_layer.w2, layer.w2)


def test_clear_errors_for_bad_folders(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json"):
        Checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="unsupported model family 'llama'"):
        Checkpoint(tmp_path)
    _hf_checkpoint(tmp_path / "m")
    for shard in (tmp_path / "m").glob("*.safetensors"):
        shard.unlink()
        break
    with pytest.raises(CheckpointError, match="missing shards"):
        Checkpoint(tmp_path / "m")


def test_fuse_qkv_stacks_the_three_weights_and_frees_them(tmp_path):
    _hf_checkpoint(tmp_path)
    spec, model = _load(tmp_path)
    attn = model.model.layers[1].self_attn
    q, k, v = (attn.q_proj.weight.clone(), attn.k_proj.weight.clone(), attn.v_proj.weight.clone())
    model.fuse_qkv()
    model.fuse_qkv()  # idempotent
    assert attn.q_proj is None and attn.k_proj is None and attn.v_proj is None
    torch.testing.assert_close(attn.qkv_proj.weight, torch.cat([q, k, v]), rtol=0, atol=0)
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.1.self_attn.qkv_proj.weight" in names
    assert not any(n.endswith((".q_proj.weight", ".k_proj.weight", ".v_proj.weight")) for n in names)
