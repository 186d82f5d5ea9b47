"""The layout of benchmarks/gluon_ws_probe.py's operands, without Gluon: sizes,
the order of a step's code words, the packers, the swizzle orders, the fp32
reference and the measured forms (Config). benchmarks/gluon_ws_kernel.py
wraps these numbers as Gluon layouts; the CPU tests read them here.

A (tile, group)'s 2,048 code words are ordered so that the consumer's
shared-memory reads are 16-byte vectors with the 32 lanes on 512 contiguous
bytes, and so that the decoded pairs are the product's A operand registers
with no data movement (CODE_OFFSETS, WORD_*_BASES). Word (r, w) holds the
nibbles of K = 2c, 2c + 1 for c = 16 s + w at bits 4s and 16 + 4s, s = 0..3;
a masked nibble read as fp16 is the subnormal q 2^-24, the product's scale
2^24 is applied once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows of a tile, K of a group (one step), tokens.
BN, BK, BM = 128, 128, 16
WORDS_PER_ROW = BK // 8  # 4-bit codes, 8 to a 32-bit word
# A (tile, group)'s code words as a box of [CODE_ROWS, 128] int32.
CODE_ROWS = BN * WORDS_PER_ROW // 128
# A masked nibble read as fp16 is q * 2^-24 (a subnormal).
SUBNORMAL_SCALE = 2.0**24
# Mixtral-8x7B: experts, hidden, intermediate.
EXPERTS, HIDDEN, INTERMEDIATE = 8, 4096, 14336

# The consumer's words [BN, WORDS_PER_ROW] as a linear layout: the product's
# A operand pair layout (k_width = 1 over [BN, BK / 2] int32, from
# gl.to_linear_layout on Triton 3.6, the same for wgmma and mma.sync) without
# the two register bits of the pair columns 16 and 32, which are the nibble
# shifts.
WORD_REG_BASES = [[8, 0], [0, 4], [0, 8], [64, 0]]
WORD_LANE_BASES = [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]]
WORD_WARP_BASES = [[16, 0], [32, 0]]
# Consumer warps a program may have: one warpgroup over the tile's 128 rows,
# or two of 64 rows each (the second 64 rows then a warp bit of the A
# operand, not a register bit, so each warpgroup's chain is half as long).
CONSUMER_WARPS = (4, 8)


def word_bases(consumer_warps: int) -> tuple[list, list, list]:
    """(register, lane, warp) bases of the consumer's words [BN, WORDS_PER_ROW]
    with consumer_warps warps: with 8, the rows 64 apart are warpgroups."""
    if consumer_warps not in CONSUMER_WARPS:
        raise ValueError(f"consumer warps must be one of {CONSUMER_WARPS}, got {consumer_warps}")
    if consumer_warps == 4:
        return WORD_REG_BASES, WORD_LANE_BASES, WORD_WARP_BASES
    return WORD_REG_BASES[:3], WORD_LANE_BASES, WORD_WARP_BASES + WORD_REG_BASES[3:]


# Tokens of a tile (the product's N): 16, or 8 (wgmma m64n8k16; cpasync only),
# which halves the product's tensor work and accumulators.
TOKEN_TILES = (8, 16)
# Offset bit i of a (tile, group)'s code words -> its (row, word). Bits 0-1:
# two register bits of the word layout (a 16-byte vector); 2-6: its lanes;
# 7-8: its warps; 9-10: its other two register bits. So one LDS.128 covers
# 512 contiguous bytes.
CODE_OFFSETS = WORD_REG_BASES[:2] + WORD_LANE_BASES + WORD_WARP_BASES + WORD_REG_BASES[2:]

# How the producer brings each step's operands (benchmarks/gluon_ws_kernel.py).
X_MODES = {"box": 0, "flat": 1, "once": 2, "swz128": 3, "cpasync": 4}
# The product: wgmma, mma.sync, none (timing only), stream (copies alone),
# nodecode (timing only: wgmma of the code words' bits as they lie, no masks
# or shifts, so the decode's share of a step shows against wgmma).
MMAS = {"wgmma": 0, "v2": 1, "none": 2, "stream": 3, "nodecode": 4}


def code_word_order() -> torch.Tensor:
    """[BN * WORDS_PER_ROW] int64: offset o of a (tile, group)'s words -> the
    flat index r * WORDS_PER_ROW + w of the word stored there."""
    o = torch.arange(BN * WORDS_PER_ROW)
    r = torch.zeros_like(o)
    w = torch.zeros_like(o)
    for bit, (dr, dw) in enumerate(CODE_OFFSETS):
        on = (o >> bit) & 1
        r ^= on * dr
        w ^= on * dw
    return r * WORDS_PER_ROW + w


def pack_codes(q: torch.Tensor) -> torch.Tensor:
    """q: uint8 [rows, K] codes 0..15 -> int32 [tiles * groups * CODE_ROWS, 128]
    in the probe's order (module docstring)."""
    rows, k = q.shape
    tiles, groups = rows // BN, k // BK
    # [tiles, BN, groups, BK/2 pairs, 2] -> pair c = 16 s + w of a group.
    qp = q.to(torch.int64).view(tiles, BN, groups, 4, WORDS_PER_ROW, 2)  # [.., s, w, half]
    shifts = (4 * torch.arange(4, device=q.device)).view(1, 1, 1, 4, 1)
    words = ((qp[..., 0] << shifts) | (qp[..., 1] << (shifts + 16))).sum(dim=3)  # [tiles, BN, groups, W]
    words = words.permute(0, 2, 1, 3).reshape(tiles, groups, BN * WORDS_PER_ROW)
    words = words[..., code_word_order().to(q.device)]
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(tiles * groups * CODE_ROWS, 128)


def pack_scales(s: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """s, o: fp16 [rows, groups] -> int32 [tiles * groups, BN], s | o << 16."""
    rows, groups = s.shape
    lo = s.view(torch.int16).to(torch.int32) & 0xFFFF
    hi = o.view(torch.int16).to(torch.int32) << 16
    words = (lo | hi).view(rows // BN, BN, groups).permute(0, 2, 1)
    return words.reshape(-1, BN).contiguous()


def reference(q, s, o, x):
    """fp32 [rows, tokens]: (o + s q) @ x^T with the group's scale and offset."""
    rows, k = q.shape
    w = q.float().view(rows, -1, BK) * s.float()[..., None] + o.float()[..., None]
    return w.view(rows, k) @ x.float().t()


def swizzle32_order() -> torch.Tensor:
    """[BK * BM] int64: element e of an activation slot's bytes in the 32-byte
    swizzle of X_LAYOUT -> the element k * BM + n of the [BK, BM] tile stored
    there. The swizzle flips 16-byte chunk bit 4 of the byte address with bit 7
    (CUTLASS Swizzle<1, 4, 3>); in 2-byte elements bit 3 with bit 6. It is its
    own inverse. A wrong guess shows in the probe's error, not as a crash."""
    e = torch.arange(BK * BM)
    return e ^ (((e >> 6) & 1) << 3)


def swizzle128_order(n: int, element_bytes: int) -> torch.Tensor:
    """[n] int64: position p of a TMA box in the 128-byte swizzle -> the
    shared-memory element it lands on. The swizzle flips byte-address bits
    4-6 with bits 7-9 (CUTLASS Swizzle<3, 4, 3>); it is its own inverse, so a
    box whose position p holds element order[p] lands in plain order."""
    p = torch.arange(n)
    chunk_bits = 4 - (element_bytes.bit_length() - 1)  # bit of a 16-byte chunk in elements
    return p ^ (((p >> (chunk_bits + 3)) & 7) << chunk_bits)


@dataclass(frozen=True)
class Config:
    """One measured form: ring depth, resident programs per multiprocessor,
    the register cap, the product (wgmma or mma.sync), the activations'
    copy (X_MODES) from x_copies copies, the groups a ring slot holds (one
    wait and one release per slot; cpasync only), the consumer's warps
    (CONSUMER_WARPS) and the tile's tokens (TOKEN_TILES)."""

    stages: int
    per_sm: int
    maxnreg: int
    mma: str
    x_mode: str
    x_copies: int
    groups_per_slot: int = 1
    consumer_warps: int = 4
    tokens: int = BM

    @staticmethod
    def parse(text: str) -> "Config":
        fields = text.split(":")
        if len(fields) not in (6, 7, 8, 9):
            raise ValueError(f"bad config {text!r}: stages:per_sm:maxnreg:mma:x_mode:x_copies"
                             "[:groups_per_slot[:consumer_warps[:tokens]]]")
        stages, per_sm, maxnreg, mma, x_mode, x_copies = fields[:6]
        optional = [int(f) for f in fields[6:]] + [1, 4, BM][len(fields) - 6:]
        config = Config(int(stages), int(per_sm), int(maxnreg), mma, x_mode, int(x_copies), *optional)
        if config.consumer_warps not in CONSUMER_WARPS:
            raise ValueError(f"bad config {text!r}: consumer_warps one of {CONSUMER_WARPS}")
        if config.tokens not in TOKEN_TILES or (config.tokens != BM and x_mode != "cpasync"):
            raise ValueError(f"bad config {text!r}: tokens one of {TOKEN_TILES}, {BM} unless cpasync")
        if HIDDEN // BK % config.groups_per_slot or (config.groups_per_slot > 1 and x_mode != "cpasync"):
            raise ValueError(f"bad config {text!r}: groups_per_slot must divide the groups, >1 only with cpasync")
        if mma not in MMAS or x_mode not in X_MODES or config.x_copies < 1:
            raise ValueError(f"bad config {text!r}: mma {'|'.join(MMAS)}, x_mode {'|'.join(X_MODES)}, x_copies >= 1")
        if x_mode not in ("flat", "swz128") and config.x_copies != 1:
            raise ValueError(f"bad config {text!r}: x_copies only with x_mode flat or swz128")
        return config

    @property
    def timing_only(self) -> bool:
        """The form computes a wrong product by design (no product, no
        decode, slots released unread, or activations copied only while the
        ring fills)."""
        return self.x_mode == "once" or self.mma in ("none", "stream", "nodecode")

    def constexprs(self, producer_regs: int) -> dict:
        return dict(STAGES=self.stages, PRODUCER_REGS=producer_regs, MMA=MMAS[self.mma],
                    X_MODE=X_MODES[self.x_mode], GPS=self.groups_per_slot, WARPS=self.consumer_warps,
                    TOKENS=self.tokens)
