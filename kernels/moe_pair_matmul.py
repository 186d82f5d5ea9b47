"""Triton device functions: the gate and up products of one expert's rows in one
K loop (kernels/moe_block_matmul.py does one block), for the tensor-core
token tiles (BM >= 8) and two blocks of one view.

Why: a gate/up program of one block pays, per group step, a fixed part
(the stage wait and two barriers, the copies' bookkeeping, the activation
sums, loop control: ~100 of the 16-token 4-bit step's 288 instructions in
the sm_90 SASS) and, per program, a prologue (the slot's tables, the page
bases) and the pair's combine (its partial sum to global memory, an arrival,
the other's sum read back). Two blocks per step share the fixed part and
the activation tile, and the program computes SiLU(gate) * up itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.moe_block_matmul import TILE_ROWS, _field_segment, _group_sums, _load_one_bit, _load_two_bit, \
    _next_brk, tile_pages
from kernels.moe_decode import decode_tile


@triton.jit
def _regions(pt_blk_ptr, pt_field_stride, r64, n_rows, n_groups, log2p, NF: tl.constexpr):
    # Per-row page bases of the block's NF fields and of its view's scales
    # (as block_matmul's prologue): (a, b, brk) each; fields >= NF repeat field 0.
    a0, b0, k0 = tile_pages(pt_blk_ptr, r64, 0, n_groups, 32, log2p)
    a1, b1, k1 = a0, b0, k0
    a2, b2, k2 = a0, b0, k0
    a3, b3, k3 = a0, b0, k0
    a4, b4, k4 = a0, b0, k0
    if NF >= 2:
        a1, b1, k1 = tile_pages(pt_blk_ptr + pt_field_stride, r64, 0, n_groups, 16, log2p)
    if NF >= 3:
        a2, b2, k2 = tile_pages(pt_blk_ptr + 2 * pt_field_stride, r64, 0, n_groups, 16, log2p)
    if NF >= 4:
        a3, b3, k3 = tile_pages(pt_blk_ptr + 3 * pt_field_stride, r64, 0, n_groups, 32, log2p)
    if NF >= 5:
        a4, b4, k4 = tile_pages(pt_blk_ptr + 4 * pt_field_stride, r64, 0, n_groups, 32, log2p)
    padded = (n_rows + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    if NF == 1 or NF >= 4:
        code_bytes = padded.to(tl.int64) * (n_groups * 32)
    else:
        code_bytes = padded.to(tl.int64) * (n_groups * 16)
    sa, sb, sk = tile_pages(pt_blk_ptr + (NF - 1) * pt_field_stride, r64, code_bytes, n_groups, 4, log2p)
    return a0, b0, k0, a1, b1, k1, a2, b2, k2, a3, b3, k3, a4, b4, k4, sa, sb, sk


@triton.jit
def _segment(a0, b0, k0, a1, b1, k1, a2, b2, k2, a3, b3, k3, a4, b4, k4, sa, sb, sk, gs, ge,
             NF: tl.constexpr):
    # One block's bases for the segment from chunk gs, and the segment's end
    # (ge cut at the block's next page break).
    ge, p0 = _field_segment(a0, b0, k0, gs, ge, 8)
    ge = _next_brk(sk, gs, ge)
    p1 = p0
    p2 = p0
    p3 = p0
    p4 = p0
    if NF >= 2:
        ge, p1 = _field_segment(a1, b1, k1, gs, ge, 4)
    if NF >= 3:
        ge, p2 = _field_segment(a2, b2, k2, gs, ge, 4)
    if NF >= 4:
        ge, p3 = _field_segment(a3, b3, k3, gs, ge, 8)
    if NF >= 5:
        ge, p4 = _field_segment(a4, b4, k4, gs, ge, 8)
    return ge, p0, p1, p2, p3, p4, tl.where(gs < sk, sa, sb)


@triton.jit
def _decoded_group(arena_ptr, p0, p1, p2, p3, p4, ps, g, c4, zero, NF: tl.constexpr, BN: tl.constexpr,
                   BM: tl.constexpr, USE_ASM: tl.constexpr):
    # (fp16 [BN, 128] group g decoded, int32 [BN] its (scale, offset) words),
    # as block_matmul's _group_step (the words tied into field 0 by zero).
    sw = tl.load(arena_ptr + ps + g * TILE_ROWS)
    f0 = _load_two_bit(arena_ptr, p0, g) | (sw & zero).to(tl.uint32)[:, None, None]
    f1 = f0
    f2 = f0
    f3 = f0
    f4 = f0
    if NF >= 2:
        f1 = _load_one_bit(arena_ptr, p1, g, c4)
    if NF >= 3:
        f2 = _load_one_bit(arena_ptr, p2, g, c4)
    if NF >= 4:
        f3 = _load_two_bit(arena_ptr, p3, g)
    if NF >= 5:
        f4 = _load_two_bit(arena_ptr, p4, g)
    return decode_tile(f0, f1, f2, f3, f4, NF, BN, USE_ASM, BM), sw


@triton.jit
def _scaled(acc, part, sw, xs, inv_step):
    # acc + the group's product scaled, plus its offset term.
    scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * inv_step
    offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return acc + part * scale[:, None] + offset[:, None] * xs[None, :]


@triton.jit
def pair_matmul(arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, log2p,
                xt_ptrs, xt_mask, xs_ptrs, xs_mask, plane_off,
                NF: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
                STAGES: tl.constexpr):
    """(gate, up) fp32 [BN, BM] each: rows `rows` of the gate block and of the
    up block (page-table rows pt_gate_ptr, pt_up_ptr; both at NF fields) over
    all K, times the activation tile, as block_matmul's tensor-core product
    of each (same arguments, one activation sum per group). The group range
    is cut at either block's page breaks."""
    tl.static_assert(BM > 1, "the pair product runs on the tensor-core tiles")
    n_groups = K // 128
    r64 = rows.to(tl.int64)
    c4 = tl.arange(0, 4)
    (ga0, gb0, gk0, ga1, gb1, gk1, ga2, gb2, gk2, ga3, gb3, gk3, ga4, gb4, gk4, gsa, gsb, gsk) = \
        _regions(pt_gate_ptr, pt_field_stride, r64, n_rows, n_groups, log2p, NF)
    (ua0, ub0, uk0, ua1, ub1, uk1, ua2, ub2, uk2, ua3, ub3, uk3, ua4, ub4, uk4, usa, usb, usk) = \
        _regions(pt_up_ptr, pt_field_stride, r64, n_rows, n_groups, log2p, NF)
    # As block_matmul: the view's factor folded into the scale, its plane.
    if NF == 2:
        inv_step = 8388608.0  # 2^23
    elif NF == 4:
        inv_step = 4194304.0  # 2^22
    else:
        inv_step = 16777216.0  # 2^24
    if NF == 1:
        xt_ptrs += 2 * plane_off
    elif NF <= 3:
        xt_ptrs += plane_off
    acc_g = tl.zeros((BN, BM), tl.float32)
    acc_u = tl.zeros((BN, BM), tl.float32)
    zero = K >> 31  # 0 at run time, opaque to the compiler (block_matmul says why)
    xs_next = _group_sums(xs_ptrs, 0, 1, xs_mask, 1, False)
    gs = 0
    while gs < n_groups:
        ge, gp0, gp1, gp2, gp3, gp4, gps = _segment(ga0, gb0, gk0, ga1, gb1, gk1, ga2, gb2, gk2, ga3, gb3, gk3,
                                                    ga4, gb4, gk4, gsa, gsb, gsk, gs, n_groups, NF)
        ge, up0, up1, up2, up3, up4, ups = _segment(ua0, ub0, uk0, ua1, ub1, uk1, ua2, ub2, uk2, ua3, ub3, uk3,
                                                    ua4, ub4, uk4, usa, usb, usk, gs, ge, NF)
        for g in tl.range(gs, ge, num_stages=STAGES):
            xs = xs_next  # [BM] activation sums of group g
            xs_next = _group_sums(xs_ptrs, tl.minimum(g + 1, n_groups - 1), 1, xs_mask, 1, False)
            xt = tl.load(xt_ptrs + g * 128, mask=xt_mask, other=0.0)  # [128, BM] x 2^-p
            w_g, sw_g = _decoded_group(arena_ptr, gp0, gp1, gp2, gp3, gp4, gps, g, c4, zero, NF, BN, BM, USE_ASM)
            acc_g = _scaled(acc_g, tl.dot(w_g, xt), sw_g, xs, inv_step)
            w_u, sw_u = _decoded_group(arena_ptr, up0, up1, up2, up3, up4, ups, g, c4, zero, NF, BN, BM, USE_ASM)
            acc_u = _scaled(acc_u, tl.dot(w_u, xt), sw_u, xs, inv_step)
        gs = ge
    return acc_g, acc_u


@triton.jit
def pair_matmul_any(nf, arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, log2p,
                    xt_ptrs, xt_mask, xs_ptrs, xs_mask, plane_off,
                    BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, STAGES: tl.constexpr):
    """pair_matmul specialised on the blocks' run-time field count nf (1..5)."""
    args = (arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, log2p,
            xt_ptrs, xt_mask, xs_ptrs, xs_mask, plane_off)
    if nf == 1:
        acc_g, acc_u = pair_matmul(*args, 1, BN, BM, USE_ASM, STAGES)
    elif nf == 2:
        acc_g, acc_u = pair_matmul(*args, 2, BN, BM, USE_ASM, STAGES)
    elif nf == 3:
        acc_g, acc_u = pair_matmul(*args, 3, BN, BM, USE_ASM, STAGES)
    elif nf == 4:
        acc_g, acc_u = pair_matmul(*args, 4, BN, BM, USE_ASM, STAGES)
    else:
        acc_g, acc_u = pair_matmul(*args, 5, BN, BM, USE_ASM, STAGES)
    return acc_g, acc_u
