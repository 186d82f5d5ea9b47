"""The torch reference of the weight layout (kernels/weight_layout.py)."""

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


def test_view_word_layout_is_little_end_first():
    q = torch.zeros(1, 128, dtype=torch.uint8)
    q[0, 1] = 0b11000000  # field 0 of weight 1 -> bits 2..3 of word 0
    q[0, 33] = 0b00100000  # field 1 of weight 33 -> bit 1 of word 1
    assert int(wl.pack_field(q, 0)[0, 0]) == 0b1100
    assert int(wl.pack_field(q, 1)[0, 1]) == 0b10


def test_virtual_order_is_a_permutation_of_each_group():
    idx = wl.virtual_to_actual()
    assert sorted(idx.tolist()) == list(range(128))
    x = torch.arange(256.0)[None]
    xp = wl.permute_groups(x)
    assert torch.equal(xp[0, :128].sort().values, x[0, :128])
    assert torch.equal(xp[0, 128:], x[0, 128 + idx])


def test_quarter_scales_follow_the_two_bit_lane_places():
    # Virtual position v holds the weight at place s = (v // 16) % 4 of its
    # byte lane (bits 2s, 2s + 1): its activation is staged times 4^-s.
    q = wl.quarter_scales()
    v = torch.arange(wl.GROUP)
    assert q.shape == (wl.GROUP,)
    assert torch.equal(q * 4.0 ** ((v // 16) % 4).float(), torch.ones(wl.GROUP))
