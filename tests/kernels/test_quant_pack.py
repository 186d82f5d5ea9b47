"""quant_pack kernel against the torch reference packer."""

import pytest
import torch

from kernels.quant_pack import quant_pack, quant_pack_reference
from kernels.weight_layout import NUM_FIELDS, field_code_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quant_pack_matches_reference(device, dtype):
    torch.manual_seed(2)
    n, k = 37, 256
    w = (torch.randn(n, k) * 0.7).to(dtype)
    w[5, 128:] = -0.5  # constant group
    w[6, :] = 0.0
    got = quant_pack(w.to(device))
    ref = quant_pack_reference(w)
    for f in range(NUM_FIELDS):
        cb = field_code_bytes(f, n, k)
        assert got[f].numel() == ref[f].numel()
        assert torch.equal(got[f][:cb].cpu(), ref[f][:cb]), f"codes of field {f}"
        # scales: identical up to one fp16 rounding step (FMA contraction)
        gs = got[f][cb:].cpu().view(torch.float16).float()
        rs = ref[f][cb:].view(torch.float16).float()
        assert torch.allclose(gs, rs, rtol=1e-3, atol=1e-6), f"scales of field {f}"


def test_quant_pack_rejects_bad_shapes(device):
    with pytest.raises(ValueError):
        quant_pack(torch.randn(4, 100, device=device))
    with pytest.raises(ValueError):
        quant_pack(torch.randn(4, 128, device=device).to(torch.int32))
