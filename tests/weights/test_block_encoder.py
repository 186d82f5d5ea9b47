"""block_encoder.encode_block: the Triton packer's byte strings serve the
weight store as the codec's do (same codes, every view within an fp16
rounding step of the codec's fit), and bad matrices are refused either way.
On a machine without a GPU the packer runs in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from dataplane.weights.block_encoder import PackedBlock, encode_block
from dataplane.weights.codec import EncodedBlock, ScaleFit, decode, encode
from dataplane.weights.layout import VIEW_BITS, field_size
from dataplane.weights.store import WeightStore

from .support import arena_for, random_block_matrix

PAGE = 1024
SHAPES = [(72, 256), (37, 128), (64, 384)]  # irregular rows: a padded last tile


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def test_codec_off_the_gpu_by_default() -> None:
    assert isinstance(encode_block(random_block_matrix(16, 128, seed=0)), EncodedBlock)


@pytest.mark.parametrize("fit", list(ScaleFit))
def test_store_from_packed_blocks_reads_like_the_codec(device, fit) -> None:
    mats = [random_block_matrix(n, k, seed=i) for i, (n, k) in enumerate(SHAPES)]
    packed = [encode_block(m.to(device), fit, packed=True) for m in mats]
    assert all(isinstance(b, PackedBlock) for b in packed)
    reference = [encode(m, fit) for m in mats]
    for bits in VIEW_BITS:
        store = WeightStore(arena_for(400, PAGE), packed, initial_bits=bits)
        for b, (m, blk) in enumerate(zip(mats, reference)):
            got_bits, got = store.decode(b)
            want = decode(blk, bits)
            assert got_bits == bits and got.shape == m.shape
            # same codes; a (scale, offset) pair may differ by an fp16 step
            step = want.abs().amax() * 2e-3
            assert float((got.cpu() - want).abs().amax()) <= step, (bits, b)


def test_packed_blocks_refuse_what_the_codec_refuses(device) -> None:
    bad = random_block_matrix(16, 128, seed=3)
    bad[2, 5] = float("nan")
    for packed in (False, True):
        with pytest.raises(ValueError, match="inf/nan"):
            encode_block(bad.to(device), packed=packed)
        with pytest.raises(ValueError):
            encode_block(torch.zeros(16, 100, device=device), packed=packed)  # K not a multiple of 128
        with pytest.raises(ValueError, match="2-D"):
            encode_block(torch.zeros(128, device=device), packed=packed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_codec_codes_do_not_depend_on_the_device() -> None:
    # Half a million weights: with the 8-bit step as torch's CUDA division by
    # a Python scalar (a reciprocal product), ~0.13 % of codes rounded the
    # other way at ties on an H200 (benchmarks/results/pack_parity_s19_h200.json).
    w = random_block_matrix(512, 1024, seed=5)
    on_gpu, on_cpu = encode(w.cuda()), encode(w)
    for f, (a, b) in enumerate(zip(on_gpu.fields, on_cpu.fields)):
        assert torch.equal(a.cpu(), b), f"field {f} codes differ"
    packed = encode_block(w.cuda(), packed=True)
    for f in range(len(on_cpu.fields)):
        size = field_size(512, 1024, f).code_bytes
        assert torch.equal(packed.field_bytes(f)[:size].cpu(), on_cpu.field_bytes(f)[:size]), f"field {f} packed"
