"""The carveout request of kernels/smem_carveout.py: its arithmetic, and that
kernels Triton leaves to the driver are not touched."""

from types import SimpleNamespace

import pytest

from kernels import smem_carveout
from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import PROGRAMS_PER_SM
from kernels.smem_carveout import (
    RESERVED_SHARED_PER_BLOCK,
    TRITON_SHARED_THRESHOLD,
    carveout_percent,
    limit_carveout,
    limit_carveout_once,
)

H200_SMEM_PER_SM = 233472  # 228 KiB


def test_percent_holds_the_programs_and_no_more_than_needed():
    shared = 58496  # the wide-tile MoE launch
    pct = carveout_percent(shared, PROGRAMS_PER_SM, H200_SMEM_PER_SM)
    need = PROGRAMS_PER_SM * (shared + RESERVED_SHARED_PER_BLOCK)
    assert pct * H200_SMEM_PER_SM >= 100 * need
    assert (pct - 1) * H200_SMEM_PER_SM < 100 * need
    assert pct == 51


def test_percent_is_capped_and_checked():
    assert carveout_percent(200_000, 2, H200_SMEM_PER_SM) == 100
    assert carveout_percent(0, 1, H200_SMEM_PER_SM) == 1
    with pytest.raises(ValueError):
        carveout_percent(1024, 0, H200_SMEM_PER_SM)
    with pytest.raises(ValueError):
        carveout_percent(-1, 1, H200_SMEM_PER_SM)


def test_small_kernels_are_left_to_the_driver():
    # No driver call happens for these (function 0 would fail if it did).
    kernel = SimpleNamespace(metadata=SimpleNamespace(shared=TRITON_SHARED_THRESHOLD), function=0)
    assert limit_carveout(kernel, PROGRAMS_PER_SM, H200_SMEM_PER_SM) is False


def test_choose_tiles_limits_the_carveout_unless_told_not_to():
    assert choose_tiles(64, 2, 8, 4096, 14336).limit_carveout
    assert not choose_tiles(64, 2, 8, 4096, 14336, limit_carveout=False).limit_carveout


def test_once_skips_launches_without_a_loaded_kernel_and_known_functions():
    done = {7}
    limit_carveout_once(None, done, PROGRAMS_PER_SM, "cpu")  # the interpreter returns no kernel
    limit_carveout_once(SimpleNamespace(function=7, metadata=None), done, PROGRAMS_PER_SM, "cpu")
    assert done == {7}


def test_once_keeps_serving_when_the_driver_refuses(monkeypatch, caplog):
    def refuse(kernel, programs, smem):
        raise RuntimeError("CUresult 1")

    monkeypatch.setattr(smem_carveout, "limit_carveout", refuse)
    monkeypatch.setattr(smem_carveout.torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(shared_memory_per_multiprocessor=H200_SMEM_PER_SM))
    monkeypatch.setattr(smem_carveout.torch.version, "hip", None)
    done = set()
    kernel = SimpleNamespace(function=9, name="_moe_down_kernel", metadata=SimpleNamespace(shared=58496))
    limit_carveout_once(kernel, done, PROGRAMS_PER_SM, "cuda")
    assert done == {9} and "kept Triton's shared-memory carveout for _moe_down_kernel" in caplog.text
