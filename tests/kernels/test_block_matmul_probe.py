"""benchmarks/block_matmul_probe.py computes what the engine's gate/up launch
computes: its bare launch of the engine's product, with the block's view read
at run time (any) and fixed at compile time (nf3), and the engine's own
launches (with the combine in, alone and at a register cap: combined,
engine168; apart from it: apart, apart1; the combine launch alone, its h
against the engine's) give the engine's gate/up pre-activations (ws.gu) at a
small irregular shape: 4 experts, 384 rows (three 128-row tiles), K = 256,
5 or 3 tokens (experts of 2-3 and 1-2 tokens)."""

import pytest
import torch

from benchmarks.block_matmul_probe import parse_form, prepare, run_forms
from benchmarks.moe_setup import MoeShape

SHAPE = MoeShape("tiny", 256, 384, 4, 2)
PAGE_BYTES = 8192  # a 64-row tile of the widest field (6 KiB at K = 384) fits one page


@pytest.mark.parametrize("batch", [5, 3])
def test_probe_sums_are_the_engines(batch, device):
    torch.manual_seed(0)
    ws, weights, tiles, _ = prepare(SHAPE, batch, PAGE_BYTES, device, sms=4)
    forms = [("any", 3), ("nf3", 2), ("engine168", 0), ("combined", 0), ("apart", 0), ("apart1", 0), ("combine", 0)]
    _, rows = run_forms(forms, SHAPE, ws, weights, tiles, PAGE_BYTES.bit_length() - 1)
    assert ws.gu.abs().sum() > 0
    for row in rows:
        assert row["rel_err_vs_engine"] < 1e-5, row


def test_forms_parse():
    assert parse_form("nf3:4") == ("nf3", 4)
    for bad in ("nf4:4", "any", "engine:x"):
        with pytest.raises(ValueError, match="name:stages"):
            parse_form(bad)
