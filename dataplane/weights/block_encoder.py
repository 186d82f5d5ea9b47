"""What the weight store copies to host pages for each block, by the fastest
encoder that fits the matrix's device.

The store needs each block's five byte strings (docs/WEIGHT_LAYOUT.md). The
plain-torch codec (codec.encode) is the reference and runs anywhere; on a
GPU the Triton packer (kernels/quant_pack.py) writes the byte strings in one
launch, with the codec's scale fits (LSQ: the same codes, pairs within an
fp16 rounding step of the codec's, tests/kernels/test_pack_matches_codec.py).
The synthetic Mixtral-8x7B build encodes 768 blocks: 25.2 ms each with
codec.encode, 0.7 ms with the packer on the H200
(benchmarks/results/build_phases_s19_h200.json); the build took 9-19 s with
the packer, 27-35 s with the codec (benchmarks/NOTES.md, session 19).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.weights.codec import DEFAULT_SCALE_FIT, EncodedBlock, ScaleFit, check_matrix, encode
from kernels.quant_pack import quant_pack


@dataclass(frozen=True)
class PackedBlock:
    """A block as kernels/quant_pack.py writes it: strings[f] is field f's
    byte string (uint8 [bytes], on the packer's device)."""

    n: int
    k: int
    strings: tuple[torch.Tensor, ...]

    def field_bytes(self, f: int) -> torch.Tensor:
        return self.strings[f]


def encode_block(w: torch.Tensor, scale_fit: ScaleFit = DEFAULT_SCALE_FIT,
                 packed: bool | None = None) -> EncodedBlock | PackedBlock:
    """W [N, K] at every precision for the store. packed: by the Triton packer
    (None: where W is on a GPU), else by codec.encode. Same checks either way:
    codec.check_matrix (ValueError)."""
    if not (w.is_cuda if packed is None else packed):
        return encode(w, scale_fit)
    check_matrix(w)
    n, k = w.shape
    if w.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        w = w.float()
    strings = quant_pack(w.contiguous(), least_squares=scale_fit == ScaleFit.LSQ)
    return PackedBlock(n, k, tuple(strings))
