"""The Triton quant/pack kernel and the weight store's plain-torch codec
(dataplane/weights/codec.py) write the same layout bytes: identical codes
in every field, and with the midpoint fit the same view scales (within one
fp16 rounding)."""

from __future__ import annotations

import torch

from dataplane.weights.codec import ScaleFit, encode
from dataplane.weights.layout import NUM_FIELDS, field_size
from kernels.quant_pack import quant_pack

ROWS, COLS = 37, 256  # irregular rows, two groups
FP16_ULP_REL = 1e-3


def _assert_same_fields(kernel_fields, block) -> list[torch.Tensor]:
    """Codes equal, pairs within one fp16 rounding; returns the codec's pairs per field (fp32)."""
    pairs = []
    for f in range(NUM_FIELDS):
        size = field_size(ROWS, COLS, f)
        ours = block.field_bytes(f)
        theirs = kernel_fields[f].reshape(-1)[: size.total]
        assert torch.equal(ours[: size.code_bytes], theirs[: size.code_bytes]), f"field {f} codes differ"
        a = ours[size.code_bytes :].view(torch.float16).float()
        b = theirs[size.code_bytes :].view(torch.float16).float()
        torch.testing.assert_close(a, b, rtol=FP16_ULP_REL, atol=1e-6, msg=f"field {f} scales differ")
        pairs.append(a)
    return pairs


def test_kernel_and_codec_write_the_same_fields(device):
    w = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(11)) * 0.02
    _assert_same_fields([f.cpu() for f in quant_pack(w.to(device))], encode(w, ScaleFit.MIDPOINT))


def test_least_squares_fit_matches_the_codec(device):
    # quant_pack(least_squares=True) against the codec's default fit
    # (ScaleFit.LSQ), constant groups (all codes equal: midpoint scale) included.
    w = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(12)) * 0.02
    w[4, 128:] = 0.3
    w[9, :] = 0.0
    fitted = _assert_same_fields([f.cpu() for f in quant_pack(w.to(device), least_squares=True)],
                                 encode(w, ScaleFit.LSQ))
    midpoint = _assert_same_fields([f.cpu() for f in quant_pack(w.to(device))], encode(w, ScaleFit.MIDPOINT))
    for f in range(NUM_FIELDS - 1):  # the fit moved the coarse views' pairs off the midpoint ones
        assert not torch.allclose(fitted[f], midpoint[f], rtol=FP16_ULP_REL, atol=1e-6)
