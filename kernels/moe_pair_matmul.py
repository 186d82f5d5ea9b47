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

from kernels.moe_block_matmul import _group_sums, add_group, block_regions, group_fields, segment_bases, \
    tensor_core_view
from kernels.moe_decode import decode_tile


@triton.jit
def pair_matmul(arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                xt_ptrs, xt_mask, xs_ptrs, xs_mask, plane_off,
                NF: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr,
                STAGES: tl.constexpr):
    """(gate, up) fp32 [BN, BM] each: rows `rows` of the gate block and of the
    up block (page-table rows pt_gate_ptr, pt_up_ptr; both at NF fields) over
    groups g0..g1, times the activation tile, as block_matmul's tensor-core
    product of each (same arguments, one activation sum per group). The
    group range is cut at either block's page breaks."""
    tl.static_assert(BM > 1, "the pair product runs on the tensor-core tiles")
    n_groups = K // 128
    r64 = rows.to(tl.int64)
    c4 = tl.arange(0, 4)
    (ga0, gb0, gk0, ga1, gb1, gk1, ga2, gb2, gk2, ga3, gb3, gk3, ga4, gb4, gk4, gsa, gsb, gsk) = \
        block_regions(pt_gate_ptr, pt_field_stride, r64, n_rows, n_groups, log2p, NF)
    (ua0, ub0, uk0, ua1, ub1, uk1, ua2, ub2, uk2, ua3, ub3, uk3, ua4, ub4, uk4, usa, usb, usk) = \
        block_regions(pt_up_ptr, pt_field_stride, r64, n_rows, n_groups, log2p, NF)
    inv_step, xt_ptrs = tensor_core_view(xt_ptrs, plane_off, NF)
    acc_g = tl.zeros((BN, BM), tl.float32)
    acc_u = tl.zeros((BN, BM), tl.float32)
    zero = K >> 31  # 0 at run time, opaque to the compiler (block_matmul says why)
    xs_next = _group_sums(xs_ptrs, g0, 1, xs_mask, 1, False)
    gs = g0
    while gs < g1:
        ge, gp0, gp1, gp2, gp3, gp4, gps = segment_bases(ga0, gb0, gk0, ga1, gb1, gk1, ga2, gb2, gk2, ga3, gb3, gk3,
                                                    ga4, gb4, gk4, gsa, gsb, gsk, gs, g1, NF)
        ge, up0, up1, up2, up3, up4, ups = segment_bases(ua0, ub0, uk0, ua1, ub1, uk1, ua2, ub2, uk2, ua3, ub3, uk3,
                                                    ua4, ub4, uk4, usa, usb, usk, gs, ge, NF)
        for g in tl.range(gs, ge, num_stages=STAGES):
            xs = xs_next  # [BM] activation sums of group g
            xs_next = _group_sums(xs_ptrs, tl.minimum(g + 1, g1 - 1), 1, xs_mask, 1, False)
            xt = tl.load(xt_ptrs + g * 128, mask=xt_mask, other=0.0)  # [128, BM] x 2^-p
            f0, f1, f2, f3, f4, sw = group_fields(arena_ptr, gp0, gp1, gp2, gp3, gp4, gps, g, c4, zero, NF)
            acc_g = add_group(acc_g, tl.dot(decode_tile(f0, f1, f2, f3, f4, NF, BN, USE_ASM, BM), xt), sw, xs,
                              inv_step)
            f0, f1, f2, f3, f4, sw = group_fields(arena_ptr, up0, up1, up2, up3, up4, ups, g, c4, zero, NF)
            acc_u = add_group(acc_u, tl.dot(decode_tile(f0, f1, f2, f3, f4, NF, BN, USE_ASM, BM), xt), sw, xs,
                              inv_step)
        gs = ge
    return acc_g, acc_u


@triton.jit
def pair_matmul_any(nf, arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                    xt_ptrs, xt_mask, xs_ptrs, xs_mask, plane_off,
                    BN: tl.constexpr, BM: tl.constexpr, USE_ASM: tl.constexpr, STAGES: tl.constexpr):
    """pair_matmul specialised on the blocks' run-time field count nf (1..5)."""
    args = (arena_ptr, pt_gate_ptr, pt_up_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
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
