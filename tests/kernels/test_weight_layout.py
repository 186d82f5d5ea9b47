"""The torch reference of the weight layout (kernels/weight_layout.py)."""

import pytest
import torch

from kernels import weight_layout as wl


def test_fields_rebuild_codes_and_views_bound_the_error():
    torch.manual_seed(1)
    n, k = 9, 384
    w = torch.randn(n, k) * 3
    w[2, :128] = 1.25  # constant group: s = 1
    fields = wl.pack_block(w)
    q, lo, s = wl.quantize_codes(w)
    for f in range(wl.NUM_FIELDS):
        assert fields[f].numel() == wl.field_bytes(f, n, k)
    code = torch.zeros(n, k, dtype=torch.int64)
    for f in range(wl.NUM_FIELDS):
        code |= wl.unpack_field(fields[f], f, n, k) << wl.FIELD_SHIFTS[f]
    assert torch.equal(code, q.long())
    for nf in range(1, wl.NUM_FIELDS + 1):
        bits = wl.view_bits(nf)
        wb = wl.dequantize_view(fields, nf, n, k)
        step = (s * 2 ** (8 - bits)).repeat_interleave(wl.GROUP, dim=1)
        err = (wb - w).abs()
        # half a view step + the 8-bit rounding + fp16 storage of scale/offset
        bound = step / 2 + s.repeat_interleave(wl.GROUP, dim=1) / 2 + 2e-3 * (w.abs() + step * 2 ** bits)
        assert bool((err <= bound).all()), (nf, (err - bound).max())
    # A constant group (s = 1 by the contract) is exact in the 8-bit view only.
    assert bool((wl.dequantize_view(fields, 5, n, k)[2, :128] == 1.25).all())


def test_field_words_hold_each_quarter_rotated_by_its_nibble_word():
    # v4: weight i = 8m + j of a quarter sits at bits 4j + NIBBLE_LSB - r
    # (mod 32) of its field word, r = 2 (m % 2) + m // 2; merging fields 0-2
    # where they lie and rotating left by r gives nibble j = the top 4 bits.
    q = torch.zeros(1, 128, dtype=torch.uint8)
    q[0, 1] = 0b11000000  # field 0 of weight 1 (m 0, j 1, r 0): bits 6..7 of word 0
    q[0, 8] = 0b01000000  # field 0 of weight 8 (m 1, j 0, r 2): bit 0 of word 0
    q[0, 24] = 0b10000000  # field 0 of weight 24 (m 3, j 0, r 3): bit 0 of word 1 (wraps from bit 31)
    q[0, 33] = 0b00100000  # field 1 of weight 33 (quarter 1, r 0): bit 5 of word 1
    assert int(wl.pack_field(q, 0)[0, 0]) == 0b11000000 | 0b1
    assert int(wl.pack_field(q, 0)[0, 1]) == 0b1
    assert int(wl.pack_field(q, 1)[0, 1]) == 1 << 5
    torch.manual_seed(3)
    q = torch.randint(0, 256, (1, 128), dtype=torch.uint8)
    words = {f: wl.pack_field(q, f)[0].tolist() for f in range(3)}
    for m in range(4):
        r = 2 * (m % 2) + m // 2
        merged = 0
        for f in range(3):
            word = words[f][m // 2] if wl.FIELD_WIDTHS[f] == 2 else words[f][0]
            mask = sum(1 << ((4 * j + wl.NIBBLE_LSB[f] + t - r) % 32) for j in range(8)
                       for t in range(wl.FIELD_WIDTHS[f]))
            merged |= (word & 0xFFFFFFFF) & mask
        nibbles = ((merged << r) | (merged >> (32 - r))) & 0xFFFFFFFF if r else merged
        assert [(nibbles >> (4 * j)) & 15 for j in range(8)] == [int(q[0, 8 * m + j]) >> 4 for j in range(8)]


def test_virtual_order_is_a_permutation_of_each_group():
    idx = wl.virtual_to_actual()
    assert sorted(idx.tolist()) == list(range(128))
    x = torch.arange(256.0)[None]
    xp = wl.permute_groups(x)
    assert torch.equal(xp[0, :128].sort().values, x[0, :128])
    assert torch.equal(xp[0, 128:], x[0, 128 + idx])


def test_narrow_slot_order_swaps_ab_and_the_quarter():
    # The 8-token tile's slot 64w + 32h + 16s + 4c + 2ab + e holds virtual
    # position 64w + 32h + 16s + 8ab + 2c + e; the wider tiles' slots are the
    # virtual positions themselves.
    assert torch.equal(wl.slot_virtual(False), torch.arange(wl.GROUP))
    narrow = wl.slot_virtual(True)
    assert sorted(narrow.tolist()) == list(range(wl.GROUP))
    for w, h, s, c, ab, e in [(0, 0, 0, 0, 1, 0), (0, 0, 0, 1, 0, 0), (0, 0, 0, 3, 1, 1), (1, 1, 1, 2, 0, 1)]:
        slot = 64 * w + 32 * h + 16 * s + 4 * c + 2 * ab + e
        assert int(narrow[slot]) == 64 * w + 32 * h + 16 * s + 8 * ab + 2 * c + e
    x = torch.arange(256.0)[None]
    assert torch.equal(wl.permute_groups(x, narrow=True)[0, 128:], x[0, 128 + wl.virtual_to_actual()[narrow]])
    # Each slot keeps its virtual position's 2^-p.
    for plane in range(wl.NUM_PLANES):
        assert torch.equal(wl.plane_scales(plane, narrow=True), wl.plane_scales(plane)[narrow])


def test_plane_scales_and_the_plane_of_each_view():
    # Plane 1 (3/4 bits): nibble places 0 / 4 by ab; plane 2 (2 bits): field
    # 0 read in place at 4 ab + 2 (1 - h); plane 0 (6/8 bits): bytes at 0.
    v = torch.arange(wl.GROUP)
    ab, h = (v // 8) % 2, (v // 32) % 2
    assert torch.equal(wl.plane_scales(0), torch.ones(wl.GROUP))
    assert torch.equal(wl.plane_scales(1) * 2.0 ** (4 * ab).float(), torch.ones(wl.GROUP))
    assert torch.equal(wl.plane_scales(2) * 2.0 ** (4 * ab + 2 * (1 - h)).float(), torch.ones(wl.GROUP))
    assert [wl.view_plane(nf) for nf in range(1, 6)] == [2, 1, 1, 0, 0]


def test_int16_activations_in_pair_order_round_trip():
    # The one-token tile's activations: per span of 64 the largest |x| maps to
    # ACT_QMAX; stored even K first in each 8; a zero span has scale 0.
    assert wl.pair_order().tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    torch.manual_seed(3)
    x = torch.randn(3, 256)
    x[1, 64:128] = 0
    x[2, :64] *= 1000
    q, scale = wl.quantize_activations(x)
    assert q.dtype == torch.int16 and scale.shape == (3, 4)
    assert float(scale[1, 1]) == 0 and not bool(q[1, 64:128].any())
    assert int(q[0, :8].float().argmax()) == int(wl.pair_order().tolist().index(int(x[0, :8].argmax())))
    back = wl.dequantize_activations(q, scale)
    err = (back - x).abs().reshape(3, 4, 64).amax(-1)
    assert bool((err <= scale / 2 + 1e-6).all())  # within half a step per span
    with pytest.raises(ValueError, match="multiple of 64"):
        wl.quantize_activations(torch.zeros(2, 96))
