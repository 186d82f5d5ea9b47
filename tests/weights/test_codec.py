"""The multi-precision codec: views vs round-to-nearest, packing, layout bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dataplane.weights.codec import (
    ScaleFit,
    decode,
    encode,
    field_from_bytes,
    pack_field,
    rtn_quantize,
    unpack_field,
)
from dataplane.weights.layout import CODE_BITS, FIELD_WIDTHS, GROUP, VIEW_BITS, field_shift, field_size

RTN_TOLERANCE = 1.10  # a view's error may be at most 10% above round-to-nearest at the same bits
REAL_WEIGHTS_ENV = "PAGEDWEIGHT_REAL_WEIGHTS"  # a .safetensors file or a folder of them
REAL_MATRICES_MAX = 12
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "pw-moe-tiny"  # once trained


def _gaussian(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


def _student_t(n: int, k: int, seed: int, df: float) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.distributions.StudentT(df).sample((n, k)) * 0.02


def _with_outliers(n: int, k: int, seed: int) -> torch.Tensor:
    w = _gaussian(n, k, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, n * k, (n * k // 500,), generator=gen)
    w.view(-1)[idx] *= 20.0
    return w


MATRICES = {
    "gaussian": lambda: _gaussian(200, 384, 0),
    "student_t3": lambda: _student_t(136, 512, 1, 3.0),
    "student_t2": lambda: _student_t(72, 256, 2, 2.0),
    "outliers": lambda: _with_outliers(96, 640, 3),
}


def _rel_to_rtn(w: torch.Tensor, w_hat: torch.Tensor, bits: int) -> float:
    return float((w - w_hat).norm() / (w - rtn_quantize(w, bits)).norm())


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_every_view_within_tolerance_of_rtn(name: str) -> None:
    w = MATRICES[name]()
    block = encode(w)
    for bits in VIEW_BITS:
        ratio = _rel_to_rtn(w, decode(block, bits), bits)
        assert ratio <= RTN_TOLERANCE, f"{name}: {bits}-bit view error is {ratio:.3f} x RTN"


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_lsq_refit_never_worse_than_midpoint(name: str) -> None:
    """The measured choice behind DEFAULT_SCALE_FIT: the refit wins on every view."""
    w = MATRICES[name]()
    mid, lsq = encode(w, ScaleFit.MIDPOINT), encode(w, ScaleFit.LSQ)
    for bits in VIEW_BITS:
        err_mid = (w - decode(mid, bits)).norm()
        err_lsq = (w - decode(lsq, bits)).norm()
        assert err_lsq <= err_mid * 1.001, f"{name} {bits} bits: lsq {err_lsq} > midpoint {err_mid}"


def _real_matrices() -> list[torch.Tensor]:
    """Up to REAL_MATRICES_MAX matrices (3-D expert stacks split per expert) with K % 128 == 0."""
    root = Path(os.environ.get(REAL_WEIGHTS_ENV, DEFAULT_MODEL))
    files = [root] if root.is_file() else sorted(root.glob("*.safetensors"))
    from safetensors import safe_open

    found: list[torch.Tensor] = []
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for key in sorted(fh.keys()):
                shape = fh.get_slice(key).get_shape()
                if len(shape) in (2, 3) and shape[-1] % GROUP == 0 and shape[-2] >= 8:
                    t = fh.get_tensor(key).float()
                    found.extend(t.unbind(0) if t.dim() == 3 else [t])
                if len(found) >= REAL_MATRICES_MAX:
                    return found[:REAL_MATRICES_MAX]
    return found


def test_views_on_real_weights() -> None:
    mats = _real_matrices()
    if not mats:
        pytest.skip(f"no trained weights in {DEFAULT_MODEL}; set {REAL_WEIGHTS_ENV} to a safetensors file or folder")
    for w in mats:
        block = encode(w)
        for bits in VIEW_BITS:
            assert _rel_to_rtn(w, decode(block, bits), bits) <= RTN_TOLERANCE


def test_fields_hold_the_truncated_codes() -> None:
    w = _gaussian(40, 256, 4)
    block = encode(w, ScaleFit.MIDPOINT)
    wg = w.reshape(40, 2, GROUP)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    s = (hi - lo) / 255
    q = torch.clamp(torch.round((wg - lo) / s), 0, 255).to(torch.int64).reshape(40, 256)
    rebuilt = torch.zeros_like(q)
    for f in range(len(FIELD_WIDTHS)):
        rebuilt |= unpack_field(block.fields[f], f) << field_shift(f)
    assert torch.equal(rebuilt, q)
    for j, bits in enumerate(VIEW_BITS):
        drop = 1 << (CODE_BITS - bits)
        scale, offset = block.scales[j][..., 0].float(), block.scales[j][..., 1].float()
        assert torch.equal(scale, (s * drop).squeeze(-1).half().float())
        assert torch.equal(offset, (lo + s * (drop - 1) / 2).squeeze(-1).half().float())


def test_pack_round_trip_and_bit_order() -> None:
    gen = torch.Generator().manual_seed(5)
    for f, width in enumerate(FIELD_WIDTHS):
        values = torch.randint(0, 1 << width, (3, 256), generator=gen)
        words = pack_field(values, f)
        assert words.dtype == torch.int32 and words.shape == (3, 256 * width // 32)
        assert torch.equal(unpack_field(words, f), values)
    # v4: bit t of weight i = 8m + j of a quarter at 4j + NIBBLE_LSB[f] + t - r
    # (mod 32), r = 2 (m % 2) + m // 2, in word m // 2 of a 2-bit field.
    one = torch.zeros(1, 128, dtype=torch.int64)
    one[0, 1] = 3  # field 0, weight 1 (m 0, j 1, r 0): bits 6..7 of word 0
    assert pack_field(one, 0)[0, 0].item() == 3 << 6
    assert pack_field(one, 4)[0, 0].item() == 3 << 4  # field 4 (nibble lsb 0): bits 4..5
    wrap = torch.zeros(1, 128, dtype=torch.int64)
    wrap[0, 24] = 3  # field 0, weight 24 (m 3, j 0, r 3): bits 31 and 0 of word 1
    assert pack_field(wrap, 0)[0, 1].item() & 0xFFFFFFFF == (1 << 31) | 1
    # 1-bit: weight (m, j) at bit 4j + lsb - r of the quarter's one word
    for f, i, bit in ((1, 1, 5), (1, 8, 31), (1, 16, 0), (2, 0, 0), (2, 8, 30), (2, 31, 25)):
        one_bit = torch.zeros(1, 32, dtype=torch.int64)
        one_bit[0, i] = 1
        assert pack_field(one_bit, f)[0, 0].item() & 0xFFFFFFFF == 1 << bit, (f, i)


def test_field_bytes_round_trip_with_padding() -> None:
    block = encode(_gaussian(24, 384, 6))
    for f in range(len(FIELD_WIDTHS)):
        raw = block.field_bytes(f)
        assert raw.numel() == field_size(24, 384, f).total
        padded = torch.cat([raw, torch.full((100,), 7, dtype=torch.uint8)])
        words, scales = field_from_bytes(padded, 24, 384, f)
        assert torch.equal(words, block.fields[f]) and torch.equal(scales, block.scales[f])


def test_field_bytes_are_tile_major_with_zero_padded_rows() -> None:
    # Item (row n, group g) at ((n // 64) * G + g) * 64 + n % 64; N = 130 pads to 192 rows.
    n, k = 130, 384
    groups = k // GROUP
    block = encode(_gaussian(n, k, 8))
    for f, width in enumerate(FIELD_WIDTHS):
        size = field_size(n, k, f)
        assert size.code_bytes == 192 * k * width // 8 and size.scale_bytes == 192 * groups * 4
        raw = block.field_bytes(f)
        words_per_item = GROUP * width // 32
        codes = raw[: size.code_bytes].view(torch.int32).reshape(-1, words_per_item)
        scales = raw[size.code_bytes :].view(torch.float16).reshape(-1, 2)
        for row, g in ((0, 0), (63, 2), (64, 1), (129, 2)):
            item = ((row // 64) * groups + g) * 64 + row % 64
            assert torch.equal(codes[item], block.fields[f][row, g * words_per_item : (g + 1) * words_per_item])
            assert torch.equal(scales[item], block.scales[f][row, g])
        pad = [((2 * groups + g) * 64 + r) for g in range(groups) for r in range(2, 64)]
        assert not codes[pad].any() and not scales[pad].view(torch.int16).any()


def test_rejects_k_not_multiple_of_group() -> None:
    with pytest.raises(ValueError, match="multiple of the group size 128"):
        encode(torch.randn(16, 200))


def test_rejects_non_finite_and_non_matrix() -> None:
    w = torch.randn(8, 128)
    w[0, 0] = float("inf")
    with pytest.raises(ValueError, match="inf/nan"):
        encode(w)
    with pytest.raises(ValueError, match="2-D"):
        encode(torch.randn(2, 8, 128))


@pytest.mark.parametrize("n", [1, 7, 33])
def test_irregular_rows_and_constant_groups(n: int) -> None:
    w = _gaussian(n, 256, 7)
    w[:, :GROUP] = 0.5  # a constant group: every view reproduces it
    block = encode(w)
    for bits in VIEW_BITS:
        w_hat = decode(block, bits)
        assert w_hat.shape == (n, 256)
        assert torch.allclose(w_hat[:, :GROUP], w[:, :GROUP], atol=1e-3)


def test_error_falls_as_bits_rise() -> None:
    w = _student_t(64, 512, 8, 3.0)
    block = encode(w)
    errors = [float((w - decode(block, bits)).norm()) for bits in VIEW_BITS]
    assert errors == sorted(errors, reverse=True)


def test_bf16_input() -> None:
    w = _gaussian(16, 128, 9).to(torch.bfloat16)
    block = encode(w)
    assert _rel_to_rtn(w.float(), decode(block, 8), 8) <= RTN_TOLERANCE
