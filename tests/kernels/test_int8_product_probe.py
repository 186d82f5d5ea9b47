"""benchmarks/int8_product_probe.py's kernel against its fp32 reference at small
irregular shapes (3 tiles, K = 384, tokens a tile minus 3): the column orders
of both products and the activations staged in them, the scale epilogues,
the masked token store. On the CPU the byte split runs as int8 arithmetic
(USE_ASM False); the GPU forms are checked by the probe itself on the device.
"""

import pytest
import torch

from benchmarks.int8_product_probe import BK, BN, Config, Problem, column_position


# The last two: 2 programs looping over the 3 tiles (one multiprocessor).
@pytest.mark.parametrize("form", ["fp16:16:2", "int8:16:2", "fp16:8:2", "int8:8:2", "fp16:8:2:2", "int8:16:2:2"])
def test_probe_product_matches_reference(form, device):
    config = Config.parse(form)
    problem = Problem(rows=3 * BN, k=3 * BK, tokens=config.tile - 3, seed=1, device=device)
    row = problem.check(config, use_asm=device == "cuda", sms=1)
    assert row["written"]
    assert row["rel_err"] < 1e-5
    if config.mode == "int8":
        # What int8 activations (one step per token and group) cost here:
        # about 0.6 % of the output against the fp16 activations.
        assert 1e-4 < row["rel_err_vs_fp16_x"] < 2e-2


@pytest.mark.parametrize("form", ["fp16:16:2", "fp16:8:2", "int8:16:2"])
def test_column_orders_are_permutations(form):
    config = Config.parse(form)
    pos, place = column_position(config.mode, config.tile)
    assert sorted(pos.tolist()) == list(range(BK))
    assert set(place.tolist()) == ({1.0} if config.mode == "int8" else {1.0, 16.0})


def test_bad_form_is_refused():
    with pytest.raises(ValueError, match="mode in"):
        Config.parse("bf16:16:4")
    with pytest.raises(ValueError, match="per_sm"):
        Config.parse("fp16:16:4:2:1")
