"""benchmarks/gluon_ws_layout.py, the layout of gluon_ws_probe.py's operands:
the packed codes, scales and activations are what its docstring states,
checked by an independent emulation on the CPU (no Gluon needed). The kernel
runs only on an H200; it agreed with the reference to 1.2e-6 there
(benchmarks/NOTES.md session 32).
"""

import pytest
import torch

from benchmarks import gluon_ws_layout as layout

BN, BK, BM = layout.BN, layout.BK, layout.BM
WORDS = layout.WORDS_PER_ROW


def _unpack_codes(words: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """The consumer's reading, emulated: offset o of a (tile, group) holds
    word (r, w) by CODE_OFFSETS; its nibble s at bits 4s / 16 + 4s is the
    code of K = 2c / 2c + 1 with c = 16 s + w."""
    tiles, groups = rows // BN, k // BK
    chunks = words.view(tiles, groups, BN * WORDS).to(torch.int64) & 0xFFFFFFFF
    q = torch.full((rows, k), -1, dtype=torch.int64)
    for o in range(BN * WORDS):
        r = w = 0
        for bit, (dr, dw) in enumerate(layout.CODE_OFFSETS):
            if (o >> bit) & 1:
                r, w = r + dr, w + dw
        word = chunks[:, :, o]  # [tiles, groups]
        for s in range(4):
            c = 16 * s + w
            for half, shift in ((0, 4 * s), (1, 16 + 4 * s)):
                rows_idx = torch.arange(tiles)[:, None] * BN + r
                cols_idx = torch.arange(groups)[None, :] * BK + 2 * c + half
                q[rows_idx, cols_idx] = (word >> shift) & 0xF
    return q


def test_packed_codes_are_read_back_by_the_stated_layout():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (3 * BN, 2 * BK), dtype=torch.uint8, generator=gen)
    words = layout.pack_codes(q)
    assert words.dtype == torch.int32 and words.shape == (3 * 2 * layout.CODE_ROWS, 128)
    assert torch.equal(_unpack_codes(words, *q.shape), q.to(torch.int64))


def test_word_layout_is_the_a_fragment_without_the_shift_bits():
    # The A operand's fragment as the PTX ISA gives it for m16n8k16 / wgmma
    # m64nNk16 (fp16, a register = a pair of K): lane l holds row l // 4 and
    # pair l % 4; register a1 is 8 rows down, a2 4 pairs right; warp w of the
    # warpgroup takes rows 16 w; further registers step the 8-pair K tiles,
    # then the second 64 rows (Triton 3.6's order, gl.to_linear_layout). The
    # pair columns 16 and 32 are the nibble shifts, so the word layout has the
    # rest, in the same order.
    fragment_lanes = [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]]
    fragment_warps = [[16, 0], [32, 0]]
    fragment_regs = [[8, 0], [0, 4], [0, 8], [0, 16], [0, 32], [64, 0]]
    shift_bits = [[0, 16], [0, 32]]
    assert layout.WORD_LANE_BASES == fragment_lanes
    assert layout.WORD_WARP_BASES == fragment_warps
    assert layout.WORD_REG_BASES == [b for b in fragment_regs if b not in shift_bits]


def test_eight_consumer_warps_put_the_second_64_rows_on_a_warpgroup():
    # wgmma with warps_per_cta [8, 1]: warpgroup 2 takes rows 64-127, so the
    # fragment's register bit for the second 64 rows becomes a warp bit; the
    # words' memory order (CODE_OFFSETS) stays, each thread then reading two
    # 16-byte vectors 2 KiB apart.
    regs, lanes, warps = layout.word_bases(8)
    assert lanes == layout.WORD_LANE_BASES
    assert warps == [[16, 0], [32, 0], [64, 0]]
    assert regs == [[8, 0], [0, 4], [0, 8]]
    assert layout.word_bases(4) == (layout.WORD_REG_BASES, layout.WORD_LANE_BASES, layout.WORD_WARP_BASES)
    held = [layout.CODE_OFFSETS.index(b) for b in regs]
    assert held == [0, 1, 9]
    with pytest.raises(ValueError):
        layout.word_bases(6)


def test_code_offsets_cover_every_word_once():
    order = layout.code_word_order()
    assert sorted(order.tolist()) == list(range(BN * WORDS))


def test_scales_pack_low_half_scale_high_half_offset():
    gen = torch.Generator().manual_seed(1)
    s = torch.rand(2 * BN, 3, generator=gen).half()
    o = (-torch.rand(2 * BN, 3, generator=gen)).half()
    words = layout.pack_scales(s, o)  # [tiles * groups, BN]
    assert words.shape == (2 * 3, BN)
    lo = (words & 0xFFFF).to(torch.int16).view(torch.float16)
    hi = ((words >> 16) & 0xFFFF).to(torch.int16).view(torch.float16)
    # chunk tile * groups + g, row r -> s[tile * BN + r, g]
    expect_s = s.view(2, BN, 3).permute(0, 2, 1).reshape(6, BN)
    expect_o = o.view(2, BN, 3).permute(0, 2, 1).reshape(6, BN)
    assert torch.equal(lo, expect_s) and torch.equal(hi, expect_o)


@pytest.mark.parametrize("n, element_bytes", [(2048, 4), (2048, 2), (128, 4)])
def test_swizzle128_flips_chunk_bits_with_row_bits_and_is_its_own_inverse(n, element_bytes):
    order = layout.swizzle128_order(n, element_bytes)
    assert torch.equal(order[order], torch.arange(n))
    byte = torch.arange(n) * element_bytes
    expect = (byte ^ (((byte >> 7) & 7) << 4)) // element_bytes
    assert torch.equal(order, expect)


def test_swizzle32_order_is_its_own_inverse_and_flips_one_chunk_bit():
    order = layout.swizzle32_order()
    assert torch.equal(order[order], torch.arange(BK * BM))
    byte = torch.arange(BK * BM) * 2
    assert torch.equal(order * 2, byte ^ (((byte >> 7) & 1) << 4))


def test_reference_applies_each_groups_scale_and_offset():
    q = torch.tensor([[1, 2] * (BK // 2) + [3] * BK], dtype=torch.uint8)  # 1 row, 2 groups
    s = torch.tensor([[0.5, 2.0]]).half()
    o = torch.tensor([[-1.0, 1.0]]).half()
    x = torch.ones(BM, 2 * BK).half()
    out = layout.reference(q, s, o, x)
    group0 = sum(-1.0 + 0.5 * v for v in [1, 2] * (BK // 2))
    group1 = BK * (1.0 + 2.0 * 3)
    assert torch.allclose(out, torch.full((1, BM), group0 + group1))


@pytest.mark.parametrize("text", ["4:2:128:tensor:box:1", "4:2:128:wgmma:tiles:1", "4:2:128:wgmma:box:2",
                                  "4:2:128:wgmma:flat:0", "4:2:128:wgmma", "4:2:128:wgmma:box:1:2",
                                  "4:2:128:v2:cpasync:1:3", "4:2:80:wgmma:cpasync:1:1:6",
                                  "4:2:80:wgmma:cpasync:1:1:8:1", "4:2:128:wgmma:box:1:1:4:8",
                                  "4:2:128:wgmma:cpasync:1:1:4:32", "4:2:128:wgmma:cpasync:1:1:4:16:1"])
def test_config_rejects_bad_input(text):
    with pytest.raises(ValueError):
        layout.Config.parse(text)


def test_config_parses_its_fields():
    config = layout.Config.parse("6:3:80:v2:swz128:16")
    assert (config.stages, config.per_sm, config.maxnreg, config.mma, config.x_mode, config.x_copies) == (
        6, 3, 80, "v2", "swz128", 16)
    assert config.constexprs(40) == dict(STAGES=6, PRODUCER_REGS=40, MMA=layout.MMAS["v2"],
                                         X_MODE=layout.X_MODES["swz128"], GPS=1, WARPS=4,
                                         TOKENS=16)
    assert layout.Config.parse("4:2:128:v2:cpasync:1:2").groups_per_slot == 2
    assert config.consumer_warps == 4
    eight = layout.Config.parse("4:2:80:wgmma:cpasync:1:1:8")
    assert eight.consumer_warps == 8 and eight.constexprs(40)["WARPS"] == 8 and eight.tokens == 16
    assert layout.Config.parse("4:2:128:wgmma:cpasync:1:1:4:8").constexprs(40)["TOKENS"] == 8
    assert not config.timing_only
    assert all(layout.Config.parse(t).timing_only for t in ("4:2:128:none:box:1", "4:2:128:stream:cpasync:1",
                                                              "4:2:128:wgmma:once:1", "4:2:128:nodecode:cpasync:1"))
