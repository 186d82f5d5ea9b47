"""Greedy pick kernel against torch's argmax: irregular widths, several chunks, ties, -inf and NaN."""

import pytest
import torch

from kernels.row_argmax import MAX_BLOCK_V, row_argmax, row_argmax_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 77), (5, 1000), (2, MAX_BLOCK_V + 931)])
def test_row_argmax_matches_torch(device, dtype, rows, vocab):
    torch.manual_seed(rows * 7 + vocab)
    x = (torch.randn(rows, vocab) * 4).to(device, dtype)
    got = row_argmax(x)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    # The bf16 -> float32 cast is exact, so the float32 argmax is the same pick.
    assert torch.equal(got.cpu(), x.float().argmax(dim=-1).cpu())


def test_row_argmax_ties_go_to_the_first_index_across_chunks(device):
    vocab = 2 * MAX_BLOCK_V + 5
    x = torch.zeros(4, vocab)
    x[0, [9, 3, MAX_BLOCK_V + 1]] = 7.0  # the lowest of three equal maxima, one in the second chunk
    x[1, [MAX_BLOCK_V + 2, 2 * MAX_BLOCK_V + 4]] = 5.0  # both after the first chunk
    x[2] = -float("inf")  # nothing finite: the first index, as torch
    x[3, -1] = 1.0  # the last column of a partial chunk
    got = row_argmax(x.to(device, torch.bfloat16))
    assert got.tolist() == [3, MAX_BLOCK_V + 2, 0, vocab - 1]
    assert torch.equal(got.cpu(), x.argmax(dim=-1))


def test_row_argmax_never_picks_nan(device):
    x = torch.randn(3, 300)
    x[0, 10] = float("nan")
    x[0, 20] = 50.0
    x[1] = float("nan")
    x[2, :] = -float("inf")
    x[2, 299] = float("nan")
    got = row_argmax(x.to(device))
    assert got.tolist() == [20, 0, 0]
    assert torch.equal(got.cpu(), row_argmax_reference(x))


def test_row_argmax_reads_strided_rows(device):
    torch.manual_seed(3)
    wide = torch.randn(3, 500).to(device, torch.bfloat16)
    view = wide[:, :333]  # row stride 500
    assert torch.equal(row_argmax(view).cpu(), view.float().argmax(dim=-1).cpu())
    assert row_argmax(wide[:0]).shape == (0,)


def test_row_argmax_rejects_bad_input(device):
    with pytest.raises(ValueError, match="unit last stride"):
        row_argmax(torch.randn(4, 6, device=device).t())
    with pytest.raises(ValueError, match="unit last stride"):
        row_argmax(torch.randn(6, device=device))
    with pytest.raises(ValueError, match="floating-point"):
        row_argmax(torch.ones(2, 3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="at least one column"):
        row_argmax(torch.ones(2, 0, device=device))
