"""Config: validation, environment, CLI."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
import torch
from pydantic import ValidationError

from dataplane.__main__ import parse_args
from dataplane.config import GIB, DataplaneConfig
from dataplane.engine_builder import build, local_walk_limits, step_kv_pages
from dataplane.weights.paged_experts import PagedExperts
from dataplane.layers.linear import Linear
from dataplane.layers.moe import SparseMoeBlock
from dataplane.layers.norm import RMSNorm
from dataplane.layers.rotary import RotaryEmbedding
from dataplane.models.mixtral import MixtralAttention
from kernels.moe_tuning import MoeTuning
from kernels.pdl import PDL_MAX_ROWS, PDL_MOE_WEIGHT_MAX_ROWS, PdlPolicy
from pagedweight.v1 import inference_pb2, inference_pb2_grpc

CLI_TIMEOUT_S = 120


def test_validation_and_defaults():
    cfg = DataplaneConfig(model_path="/m", device="cpu")
    assert cfg.kv_block_size == 16 and cfg.resolved_dtype() == torch.float32
    assert cfg.resolved_device() == torch.device("cpu")
    assert cfg.resolved_dataplane_id(5).endswith("-5")
    for bad in (
        {},  # neither model nor synthetic
        {"model_path": "/m", "synthetic": "mixtral-tiny"},
        {"model_path": "/m", "max_batched_tokens": 8, "max_running_seqs": 16},
        {"model_path": "/m", "controlplane": "nohostport"},
        {"model_path": "/m", "device": "tpu"},
        {"model_path": "/m", "kv_block_size": 0},
        {"model_path": "/m", "dtype": "int8"},
    ):
        with pytest.raises(ValidationError):
            DataplaneConfig(**bad)


def test_environment_is_read_and_flags_win(monkeypatch):
    monkeypatch.setenv("PW_DATAPLANE_PORT", "6000")
    monkeypatch.setenv("PW_DATAPLANE_MODEL_PATH", "/from/env")
    assert DataplaneConfig().port == 6000 and DataplaneConfig().model_path == "/from/env"
    overrides = parse_args(["--model", "/flag", "--port", "7000", "--gpu-memory-gb", "1.5"])
    cfg = DataplaneConfig(**overrides)
    assert cfg.model_path == "/flag" and cfg.port == 7000
    assert cfg.memory_budget_bytes == int(1.5 * GIB)


def test_cli_serves_and_prints_its_address(random_ckpt):
    cmd = [sys.executable, "-m", "dataplane", "--model", str(random_ckpt), "--port", "0", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("dataplane serving pw-random on 127.0.0.1:"), line
        address = line.split()[-1]
        with grpc.insecure_channel(address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            info = stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=CLI_TIMEOUT_S)
            assert info.model_name == "pw-random"
        proc.terminate()
        assert proc.wait(CLI_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_moe_tuning_from_the_environment_reaches_every_expert_layer(monkeypatch):
    monkeypatch.setenv("PW_DATAPLANE_MOE_TUNING", '{"tensor_core_stages": 3, "one_token_maxnreg": 200}')
    cfg = DataplaneConfig(synthetic="mixtral-tiny", cpu_arena_bytes=4 << 20)
    assert cfg.moe_tuning == MoeTuning(tensor_core_stages=3, one_token_maxnreg=200)
    for bad in ({"tensor_core_stages": 0}, {"one_token_maxnreg": 999}, {"no_such_knob": 1}):
        with pytest.raises(ValidationError):
            DataplaneConfig(synthetic="mixtral-tiny", moe_tuning=bad)
    model = build(cfg).engine.runner.model
    experts = [m for m in model.modules() if isinstance(m, PagedExperts)]
    assert experts and all(m.moe_tuning == cfg.moe_tuning for m in experts)


def test_pdl_max_rows_from_the_environment_reaches_every_launching_module(monkeypatch):
    assert DataplaneConfig.model_fields["pdl_max_rows"].default == PDL_MAX_ROWS
    with pytest.raises(ValidationError):
        DataplaneConfig(synthetic="mixtral-tiny", pdl_max_rows=-1)
    monkeypatch.setenv("PW_DATAPLANE_PDL_MAX_ROWS", "3")
    cfg = DataplaneConfig(synthetic="mixtral-tiny", cpu_arena_bytes=4 << 20)
    assert cfg.pdl_max_rows == 3
    model = build(cfg).engine.runner.model
    # Every kind of module that launches a PDL kernel holds the policy.
    kinds = (RMSNorm, Linear, RotaryEmbedding, MixtralAttention, SparseMoeBlock, PagedExperts)
    for kind in kinds:
        found = [m for m in model.modules() if isinstance(m, kind)]
        assert found and all(m.pdl.max_rows == 3 for m in found), kind.__name__
    experts = [m for m in model.modules() if isinstance(m, PagedExperts)]
    assert all(m.pdl.moe_weights().max_rows == 3 for m in experts)  # the weights' 16 capped by 3


def test_the_moe_weight_launches_own_pdl_limit_reaches_the_experts(monkeypatch):
    assert DataplaneConfig.model_fields["pdl_moe_weight_max_rows"].default == PDL_MOE_WEIGHT_MAX_ROWS
    with pytest.raises(ValidationError):
        DataplaneConfig(synthetic="mixtral-tiny", pdl_moe_weight_max_rows=-1)
    monkeypatch.setenv("PW_DATAPLANE_PDL_MAX_ROWS", "48")
    monkeypatch.setenv("PW_DATAPLANE_PDL_MOE_WEIGHT_MAX_ROWS", "8")
    model = build(DataplaneConfig(synthetic="mixtral-tiny", cpu_arena_bytes=4 << 20)).engine.runner.model
    experts = [m for m in model.modules() if isinstance(m, PagedExperts)]
    assert experts and all(m.pdl == PdlPolicy(max_rows=48, moe_weight_max_rows=8) for m in experts)
    assert all(m.pdl.moe_weights() == PdlPolicy(max_rows=8) for m in experts)


def test_unset_watermarks_are_derived_from_one_steps_kv_pages():
    cfg = DataplaneConfig(model_path="/m", max_batched_tokens=2000, max_running_seqs=40, kv_block_size=16)
    step = step_kv_pages(cfg)
    assert step == 125 + 40  # 2000 tokens in blocks of 16, plus one open block per sequence
    big = local_walk_limits(cfg, total_pages=27_136)  # a Mixtral-8x7B arena of 2 MiB pages
    assert big.low_watermark == pytest.approx(step / 27_136)
    assert big.high_watermark == pytest.approx(3 * step / 27_136)
    small = local_walk_limits(cfg, total_pages=1000)  # one step is 16.5 %: the old fixed values cap it
    assert (small.low_watermark, small.high_watermark) == (0.05, 0.15)
    # A configured watermark is kept, and the derived one never crosses it.
    low_only = local_walk_limits(cfg.model_copy(update={"low_watermark": 0.2}), total_pages=27_136)
    assert (low_only.low_watermark, low_only.high_watermark) == (0.2, 0.2)
    high_only = local_walk_limits(cfg.model_copy(update={"high_watermark": 0.001}), total_pages=27_136)
    assert (high_only.low_watermark, high_only.high_watermark) == (0.001, 0.001)
    both = local_walk_limits(cfg.model_copy(update={"low_watermark": 0.01, "high_watermark": 0.03}), 27_136)
    assert (both.low_watermark, both.high_watermark) == (0.01, 0.03)
    with pytest.raises(ValidationError):
        DataplaneConfig(model_path="/m", low_watermark=0.2, high_watermark=0.1)


def test_the_built_controller_walks_by_the_derived_watermarks(random_ckpt):
    cfg = DataplaneConfig(model_path=str(random_ckpt), device="cpu", max_batched_tokens=64, max_running_seqs=4)
    built = build(cfg)
    assert built.precision.limits == local_walk_limits(cfg, built.engine.arena.num_pages)
    assert 0 < built.precision.limits.low_watermark < built.precision.limits.high_watermark
