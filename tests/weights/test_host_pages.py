"""HostPagePool: zeroed page views carved from power-of-two slabs, aligned to the arena's base."""

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


def test_without_slabs_each_request_takes_one_spare_page() -> None:
    pool = HostPagePool(PAGE, pin=False)
    pool.take(3)
    pool.take(2)
    assert pool.allocated_bytes == (3 + 1 + 2 + 1) * PAGE  # the spare page aligns the buffer


@pytest.mark.parametrize("slabs", [False, True])
def test_views_sit_whole_pages_from_align_to(slabs: bool) -> None:
    # A page table names host pages as page offsets from the arena's base
    # (docs/WEIGHT_LAYOUT.md, "Host pages"): every view must start a whole
    # number of pages from align_to, whatever the allocator returned.
    page = 4096
    base = torch.empty(8, dtype=torch.uint8).data_ptr() + 48  # an arena base off any page boundary
    pool = HostPagePool(page, pin=False, slabs=slabs, align_to=base)
    for n in (1, 3, 2, 5):
        view = pool.take(n)
        assert (view.data_ptr() - base) % page == 0
        assert pool.page_offset(view) == (view.data_ptr() - base) // page
        if n > 1:
            assert pool.page_offset(view[1:]) == pool.page_offset(view) + 1
    with pytest.raises(ValueError, match="not handed out"):
        pool.page_offset(torch.zeros(2, page, dtype=torch.uint8))


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        HostPagePool(0, pin=False)
    with pytest.raises(ValueError):
        HostPagePool(PAGE, pin=False).take(0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_views_are_page_locked_and_copy_asynchronously() -> None:
    pool = HostPagePool(PAGE, pin=True)
    views = [pool.take(n) for n in (3, 40, 100)]  # the third opens a second slab
    assert all(v.is_pinned() and int(v.sum()) == 0 for v in views)
    src = torch.arange(100 * PAGE, device="cuda").to(torch.uint8).reshape(100, PAGE)
    views[2].copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(views[2], src.cpu())
    kept = views[0]
    del pool  # unregisters; a view that outlives the pool stays valid memory
    assert not kept.is_pinned() and int(kept.sum()) == 0
