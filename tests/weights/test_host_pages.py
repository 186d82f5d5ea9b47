"""HostPagePool: zeroed page views carved from power-of-two slabs."""

from __future__ import annotations

import pytest
import torch

from dataplane.weights.host_pages import FIRST_SLAB_BYTES, MAX_SLAB_BYTES, HostPagePool

PAGE = 1 << 20


def test_slab_views_are_disjoint_zeroed_and_bounded() -> None:
    pool = HostPagePool(PAGE, pin=False, slabs=True)
    views = [pool.take(n) for n in (9, 5, 17, 30, 3, 70)]
    for i, v in enumerate(views):
        assert v.shape[1] == PAGE and v.dtype == torch.uint8
        assert int(v.sum()) == 0
        v.fill_(i + 1)
    for i, v in enumerate(views):  # no view overwrote another
        assert bool((v == i + 1).all())
    need = sum(v.numel() for v in views)
    # Waste is bounded by slab tails: slabs double from FIRST_SLAB_BYTES up to MAX_SLAB_BYTES.
    assert need <= pool.allocated_bytes <= need + FIRST_SLAB_BYTES + MAX_SLAB_BYTES


def test_request_larger_than_a_slab_gets_its_own() -> None:
    pool = HostPagePool(PAGE, pin=False, slabs=True)
    big = pool.take(FIRST_SLAB_BYTES // PAGE + 1)
    assert big.shape[0] == FIRST_SLAB_BYTES // PAGE + 1


def test_without_slabs_each_request_is_exact() -> None:
    pool = HostPagePool(PAGE, pin=False)
    pool.take(3)
    pool.take(2)
    assert pool.allocated_bytes == 5 * PAGE


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        HostPagePool(0, pin=False)
    with pytest.raises(ValueError):
        HostPagePool(PAGE, pin=False).take(0)
