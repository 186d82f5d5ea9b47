"""The benchmark scaffolding's configuration names and routings
(benchmarks/moe_setup.py), which the GPU probes rely on."""

import pytest
import torch

from benchmarks.moe_setup import (MIXTRAL, QWEN, MoeShape, build_store, fields_config, projection_views, routing,
                                  two_views)
from kernels import weight_layout as wl
from kernels.moe_paged import check_weights


def test_mixed_is_the_named_projection_views():
    mixed = fields_config(MIXTRAL, 2, "mixed")
    assert torch.equal(mixed, fields_config(MIXTRAL, 2, "views-2.6.2-6.2.6"))
    assert torch.equal(fields_config(MIXTRAL, 2, "mixed3-8"), fields_config(MIXTRAL, 2, "views-3.8.3-8.3.8"))


def test_projection_views_place_each_block():
    cfg = fields_config(MIXTRAL, 2, "views-2.6.4-6.2.4").reshape(2, MIXTRAL.experts, 3)
    f = wl.fields_for_bits
    assert cfg[:, 0::2].tolist() == [[[f(2), f(6), f(4)]] * 4] * 2
    assert cfg[:, 1::2].tolist() == [[[f(6), f(2), f(4)]] * 4] * 2
    assert projection_views("4") is None


def test_two_views_names_half_and_half_mixes_wherever_the_blocks_are():
    assert two_views("mixed") == (2, 6)  # inside each expert
    assert two_views("mixed3-8") == (3, 8)
    assert two_views("views-6.6.6-2.2.2") == (2, 6)  # whole experts, the planner's kind
    assert two_views("views-2.2.2-6.6.6") == (2, 6)
    assert two_views("views-2.6.4-6.2.4") is None  # three views
    assert two_views("views-2.2.6-2.2.6") is None  # two views, not half and half
    assert two_views("views-4.4.4-4.4.4") is None
    assert two_views("4") is None


@pytest.mark.parametrize("name", ["views-2.6-6.2.4", "views-2.6.5-6.2.4", "views-a.b.c-1.2.3", "views-2.6.4"])
def test_bad_projection_views_are_refused(name):
    with pytest.raises(ValueError, match="views-G.U.D-G.U.D"):
        fields_config(MIXTRAL, 1, name)


@pytest.mark.parametrize("shape,batch,used", [(MIXTRAL, 16, 7), (MIXTRAL, 3, 2), (QWEN, 9, 13)])
def test_roundrobin_over_the_first_experts(shape, batch, used):
    ids, w = routing(shape, batch, "cpu", mode=f"roundrobin:{used}")
    assert ids.shape == (batch, shape.top_k) and w.shape == (batch, shape.top_k)
    assert all(len(set(row)) == shape.top_k for row in ids.tolist())  # distinct experts per token
    counts = torch.bincount(ids.reshape(-1).long(), minlength=shape.experts)
    assert counts[used:].sum() == 0
    assert counts[:used].max() - counts[:used].min() <= 1  # equal loads, as plain round robin
    assert torch.allclose(w.sum(-1), torch.ones(batch))


def test_plain_roundrobin_is_over_every_expert():
    ids, _ = routing(MIXTRAL, 16, "cpu")
    assert torch.equal(ids, routing(MIXTRAL, 16, "cpu", mode=f"roundrobin:{MIXTRAL.experts}")[0])
    assert ids.reshape(-1).tolist() == [i % MIXTRAL.experts for i in range(32)]


@pytest.mark.parametrize("mode", ["roundrobin:1", "roundrobin:9", "random:4", "roundrobin:x", "zipf"])
def test_bad_routing_is_refused(mode):
    with pytest.raises(ValueError, match="routing|roundrobin:N"):
        routing(MIXTRAL, 4, "cpu", mode=mode)


def test_build_store_gives_the_tables_the_kernels_check():
    # The layer benchmarks' synthetic store must pass the launches' own table
    # checks (int64 page offsets since session 54; kernels/moe_paged.py).
    tiny = MoeShape("tiny", 128, 256, 4, 2)
    page = 1 << (wl.TILE_ROWS * 256 - 1).bit_length()  # the widest 8-bit tile, a power of two
    weights = build_store(tiny, 1, page, "cpu")
    assert weights.page_table.dtype == torch.int64
    assert check_weights(weights, tiny.hidden, tiny.ffn, tiny.experts * 3) == page.bit_length() - 1
