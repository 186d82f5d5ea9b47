"""benchmarks/e2e_knobs.py: every A/B flag of e2e_decode.py reaches the
DataplaneConfig field it names, the defaults are the shipped config, and the
dense kernel's launch shape lands on the model's attention projections."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.e2e_knobs import add_knob_arguments, apply_knobs, knob_config
from dataplane.config import DataplaneConfig
from dataplane.models.mixtral import MixtralAttention
from dataplane.models.synthetic import build_synthetic
from kernels.dense_mma import MmaTiles


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_knob_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_reach_their_config_fields():
    args = parse("--no-fuse-qkv", "--no-fuse-moe-entry", "--dense-gemv-max-tokens", "0", "--dense-mma-max-tokens",
                 "8", "--fuse-qkv-rotary", "--pdl-max-rows", "64", "--pdl-moe-weight-max-rows", "16",
                 "--narrow-tile-stages", "3", "--down-zigzag", "--no-overlap",
                 "--down-group-cost", "16,18,19,21,23")
    cfg = DataplaneConfig(synthetic="mixtral-tiny", **knob_config(args))
    assert not cfg.fuse_qkv and not cfg.fuse_moe_entry
    assert (cfg.dense_gemv_max_tokens, cfg.dense_mma_max_tokens) == (0, 8)
    assert cfg.fuse_qkv_rotary and not cfg.overlap_steps
    assert (cfg.pdl_max_rows, cfg.pdl_moe_weight_max_rows) == (64, 16)
    assert cfg.moe_tuning.narrow_tile_stages == 3 and cfg.moe_tuning.down_zigzag
    assert cfg.moe_tuning.down_group_cost == (16, 18, 19, 21, 23)


def test_a_bad_cost_table_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        parse("--down-group-cost", "8,x,11,13,15")


def test_no_flag_is_the_shipped_config():
    config = knob_config(parse())
    shipped = DataplaneConfig(synthetic="mixtral-tiny")
    assert config and all(getattr(shipped, name) == value for name, value in config.items())


def test_the_launch_shape_lands_on_the_attention_projections():
    _, model = build_synthetic("mixtral-tiny", torch.device("cpu"), torch.float32, seed=0)
    model.fuse_qkv()
    apply_knobs(parse("--dense-mma-max-tokens", "8", "--dense-mma-tiles", '{"block_n": 32, "num_stages": 3}'), model)
    attention = [m for m in model.modules() if isinstance(m, MixtralAttention)]
    tiles = MmaTiles(block_n=32, num_stages=3)
    assert attention and all(p.mma_tiles == tiles and p.mma_max_tokens == 8
                             for a in attention for p in (a.qkv_proj, a.o_proj))
    apply_knobs(parse(), model)  # no --dense-mma-tiles: the model is left as it is
    assert all(a.o_proj.mma_tiles == tiles for a in attention)
