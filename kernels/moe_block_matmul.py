"""Triton device functions: one block's product W_b @ x^T with W_b read through
the weight store's page table at the block's own bitwidth (docs/WEIGHT_LAYOUT.md,
v4); the decode of a group is kernels/moe_decode.py.

How the reads stay whole: a field's byte string holds its rows in tiles of
64 (since v2), so the words of one (tile, group) are one contiguous run
(2 KiB for a 2-bit field); a program's step over 64 or 128 rows reads one or two runs
instead of one 32-byte chunk from each of 128 rows 1 KiB apart (v1). Measured
without any decode (benchmarks/bench_access.py): 48-56 % of the copy
bandwidth in v1's order, 71-94 % tile-major.

How the scales apply: the per-group scale and offset are applied to the dot
product of the group, sum_k x_k (o + s t_k) = o * sum(x) + s * sum(x t),
with the activation group sums precomputed once per token. (Taking the
offset term out of the K loop as one product per program was measured
slower: benchmarks/NOTES.md, session 12.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import weight_layout
from kernels.moe_cuda_core import group_activations, group_dot, view_place
from kernels.moe_decode import decode_tile

TILE_ROWS = tl.constexpr(weight_layout.TILE_ROWS)


@triton.jit
def row_pages(pt_ptr, start, row_bytes, CHUNK: tl.constexpr, log2p):
    """Per-row page bases of one field region.

    pt_ptr: int64 [max_pages] page-table row of one (block, field); start:
    int64 [BN] byte offset of each row inside the field's byte string. A row
    spans at most two pages (page_bytes >= row_bytes, checked by wrappers).
    Returns (base_a, base_b, brk): int64 word index, from the arena's base, of
    the row's first byte for chunks < brk, and the same for the chunks after
    the page boundary; chunks are CHUNK bytes and never straddle a page. An
    entry outside the arena (a host page of a block read in place) gives an
    index outside it too: the pointer arithmetic is the same.
    """
    page_a = start >> log2p
    page_b = (start + row_bytes - 1) >> log2p
    entry_a = tl.load(pt_ptr + page_a).to(tl.int64)
    entry_b = tl.load(pt_ptr + page_b).to(tl.int64)
    in_page = start - (page_a << log2p)
    brk = ((page_a + 1) << log2p) - start
    base_a = ((entry_a << log2p) + in_page) >> 2
    base_b = ((entry_b << log2p) - brk) >> 2
    return base_a, base_b, (brk // CHUNK).to(tl.int32)


@triton.jit
def tile_pages(pt_ptr, r64, first_byte, n_groups, CB: tl.constexpr, log2p):
    """row_pages for tile-major fields (v2): per-row word bases for group 0.

    r64: int64 [BN] rows; first_byte: byte offset of the region (codes 0,
    scales after the codes); CB: bytes per (row, group). A tile's groups are
    runs of 64 * CB bytes, so chunks are runs and a row's word for group g is
    base + g * 64 * CB / 4.
    """
    tile_bytes = TILE_ROWS * n_groups * CB
    a, b, brk = row_pages(pt_ptr, first_byte + (r64 // TILE_ROWS) * tile_bytes, tile_bytes, TILE_ROWS * CB,
                          log2p)
    inside = (r64 % TILE_ROWS) * (CB // 4)
    return a + inside, b + inside, brk


@triton.jit
def rows_of_tile(rows, m0):
    """rows ([BN] int32), made to depend on the token tile that starts at m0
    (>= 0) by an opaque zero. A launch that loops over token tiles passes
    them so: else the compiler hoists every view's per-row page bases
    (tile_pages) out of that loop and keeps them live through all K loops
    (local sm_90 SASS, 8-token tile: gate/up 255 registers + 48 B of stack
    -> 238 + 0, down 255 -> 209; the H100 layer, Mixtral 4-bit B=16: 310.3
    -> 299.0 us, benchmarks/NOTES.md session 60)."""
    return rows | (m0 >> 31)


@triton.jit
def _seg_base(base_a, base_b, brk, gs, ALIGN: tl.constexpr):
    # Row bases valid for the whole segment starting at chunk gs.
    return tl.multiple_of(tl.where(gs < brk, base_a, base_b), ALIGN)


@triton.jit
def _next_brk(brk, gs, ge):
    # First page boundary (in chunks) after gs over all rows, capped at ge.
    return tl.minimum(tl.min(tl.where(brk > gs, brk, ge), axis=0), ge)


@triton.jit
def _field_segment(base_a, base_b, brk, gs, ge, ALIGN: tl.constexpr):
    # One field's part of the segment starting at chunk gs: the segment's end
    # cut at the field's next page break, and the field's row bases.
    return _next_brk(brk, gs, ge), _seg_base(base_a, base_b, brk, gs, ALIGN)


@triton.jit
def _load_two_bit(arena_ptr, base, g):
    # -> uint32 [BN, 4, 2]: group g, quarter c (8 bytes), word. Loaded as the
    # row's 8 contiguous words so that the copies are 16 bytes wide.
    off = base[:, None] + (g * (TILE_ROWS * 8) + tl.arange(0, 8)[None, :])
    words = tl.load(arena_ptr + off).to(tl.uint32, bitcast=True)
    return tl.reshape(words, (words.shape[0], 4, 2))


@triton.jit
def _load_one_bit(arena_ptr, base, g, c4):
    # -> uint32 [BN, 4]: group g, quarter c (4 bytes).
    off = base[:, None] + (g * (TILE_ROWS * 4) + c4[None, :])
    return tl.load(arena_ptr + off).to(tl.uint32, bitcast=True)


@triton.jit
def _group_sums(xs_ptrs, g, xs_group_stride, xs_mask, XS_SUB: tl.constexpr, ACT_CG: tl.constexpr):
    # -> fp32 [BM]: activation sums of group g (XS_SUB partial sums added).
    xs = _act_load(xs_ptrs + g * xs_group_stride, xs_mask, ACT_CG)
    for j in tl.static_range(1, XS_SUB):
        xs += _act_load(xs_ptrs + g * xs_group_stride + j, xs_mask, ACT_CG)
    return xs


@triton.jit
def _act_load(ptrs, mask, ACT_CG: tl.constexpr):
    # fp32 activation sums; ACT_CG: from the L2, never the L1 (see
    # block_matmul).
    if ACT_CG:
        v = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
    return v


@triton.jit
def _group_step(acc, xs_next, arena_ptr, p0, p1, p2, p3, p4, ps, g, g1, c4, zero, inv_step,
                xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, qs_ptrs,
                XS_SUB: tl.constexpr, NF: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                USE_ASM: tl.constexpr, ACT_CG: tl.constexpr):
    # Group g of one segment: acc [BN, BM] += its product, scaled, plus its
    # offset term; returns (acc, the activation sums of group g + 1).
    sw = tl.load(arena_ptr + ps + g * TILE_ROWS)  # [BN] (scale, offset) fp16 pair
    xs = xs_next  # [BM] activation sums of group g
    g_next = tl.minimum(g + 1, g1 - 1)
    xs_next = _group_sums(xs_ptrs, g_next, xs_group_stride, xs_mask, XS_SUB, ACT_CG)
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
    if BM > 1:
        w = decode_tile(f0, f1, f2, f3, f4, NF, BN, USE_ASM, BM)  # [BN, 128] fp16
        xt = tl.load(xt_ptrs + g * 128, mask=xt_mask, other=0.0)  # [128, BM] x 2^-p
        part = tl.dot(w, xt)  # [BN, BM] = 2^-24 sum t x (times the view's factor)
    else:
        # One token on the CUDA cores, by dp2a against the
        # token's int16 activations (kernels/moe_cuda_core.py); with one row
        # per thread (MoeTiles: num_warps = BN / 32) each row's sum stays in
        # its thread. Every thread reads the whole group of activations
        # (from shared memory; group_activations spreads their copy).
        tl.static_assert(BM == 1, "the CUDA-core product takes one token per tile")
        act = group_activations(xt_ptrs + g * 64, BN)  # [64] int32: int16 pairs, pair order
        if ACT_CG:  # [2] fp32 scales of the group's spans
            act_scale = tl.load(qs_ptrs + g * 2, cache_modifier=".cg")
        else:
            act_scale = tl.load(qs_ptrs + g * 2)
        part = group_dot(f0, f1, f2, f3, f4, act, act_scale, NF, BN, USE_ASM)[:, None]  # [BN, 1] sum t x * place
    scale = (sw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * inv_step
    offset = ((sw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    acc = acc + part * scale[:, None]
    acc = acc + offset[:, None] * xs[None, :]
    return acc, xs_next


@triton.jit
def block_matmul(arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                 xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, qs_ptrs,
                 XS_SUB: tl.constexpr, NF: tl.constexpr, BN: tl.constexpr,
                 BM: tl.constexpr, USE_ASM: tl.constexpr, STAGES: tl.constexpr, ACT_CG: tl.constexpr = False):
    """acc fp32 [BN, BM] = W_b[rows, groups g0..g1) @ x[groups]^T for one block.

    arena_ptr: int32 [num_pages * page_bytes / 4] the arena as words;
    pt_blk_ptr: int64 [5, max_pages] the block's page-table rows (field stride
    pt_field_stride); rows: int32 [BN] in-range row indices; xt_ptrs: fp16
    pointers [128, BM] to group 0 of the activation tile (virtual order);
    xs_ptrs: fp32 pointers [BM] to the activation sums of group 0, XS_SUB
    partial sums per group, xs_group_stride apart per group (sums of plane 0).
    plane_off: elements from one activation plane to the next (the view's
    plane: weight_layout.view_plane, its factors weight_layout.plane_scales).
    The CUDA-core product (BM = 1, one valid token) reads instead int16
    activations (weight_layout.quantize_activations): xt_ptrs int32 pointers
    [64] to the words of group 0, qs_ptrs fp32 pointers [2] to the scales of
    its spans (unused for BM > 1), xt_mask and plane_off unused. The
    tensor-core tiles (BM >= 8) read xt_ptrs' rows in moe_decode.tile_k_order.
    STAGES: pipeline depth of the K loop (MoeTiles.num_stages, or
    wide_loop_stages for a launch's wide token tile).
    The group range is cut into segments at the page boundaries of the tile's
    rows, so inside a segment every row reads through one fixed page base.
    ACT_CG: read the activation sums and scales from the L2 only, for
    activations written by other programs of the same launch
    (kernels/moe_gate_up_down.py): an L1 is not coherent with other
    multiprocessors' stores, and a sector of these small rows can hold
    another range's values, read before they were written.
    """
    n_groups = K // 128
    r64 = rows.to(tl.int64)
    c4 = tl.arange(0, 4)
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
    # Scales of the NF-field view sit after the codes of field NF - 1 (whole
    # tiles: the last one is padded).
    padded = (n_rows + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    if NF == 1 or NF >= 4:
        code_bytes = padded.to(tl.int64) * (n_groups * 32)
    else:
        code_bytes = padded.to(tl.int64) * (n_groups * 16)
    sa, sb, sk = tile_pages(pt_blk_ptr + (NF - 1) * pt_field_stride, r64, code_bytes, n_groups, 4, log2p)
    # The decode yields t 2^p 2^-24 against activations staged times 2^-p,
    # except for a constant factor per view (the 3-bit code sits one bit up
    # its nibble, the 6-bit code two bits up its byte): fold 2^24 / factor
    # into the scale. The activations' plane of the view sits plane * plane_off
    # elements after plane 0 (weight_layout.view_plane).
    if BM == 1:
        inv_step = view_place(NF)
    elif NF == 2:
        inv_step = 8388608.0  # 2^23
    elif NF == 4:
        inv_step = 4194304.0  # 2^22
    else:
        inv_step = 16777216.0  # 2^24
    if BM > 1:
        if NF == 1:
            xt_ptrs += 2 * plane_off
        elif NF <= 3:
            xt_ptrs += plane_off
    acc = tl.zeros((BN, BM), tl.float32)
    # Latency of the two small per-group loads (ncu stall sampling on the H200:
    # their global-load waits and the layout conversions they caused were the
    # largest stalls of the loop). The (scale, offset) load is tied into the
    # decode by a zero that the compiler cannot fold, so Triton's pipeliner
    # treats it as an operand of the dot and streams it through shared memory
    # with the fields, stages ahead; the activation sums of the next group are
    # loaded one iteration ahead by hand.
    zero = K >> 31  # 0 at run time (K < 2^31), opaque to the compiler
    xs_next = _group_sums(xs_ptrs, g0, xs_group_stride, xs_mask, XS_SUB, ACT_CG)
    gs = g0
    while gs < g1:
        ge, p0 = _field_segment(a0, b0, k0, gs, g1, 8)
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
        ps = tl.where(gs < sk, sa, sb)
        if BM > 1:
            # The launch's num_stages would pipeline a plain range too, but
            # one depth for every loop; a launch with a wide tile gives each
            # token tile's loop its own (MoeTiles.wide_stages).
            for g in tl.range(gs, ge, num_stages=STAGES):
                acc, xs_next = _group_step(acc, xs_next, arena_ptr, p0, p1, p2, p3, p4, ps, g, g1, c4, zero,
                                           inv_step, xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride,
                                           qs_ptrs, XS_SUB, NF, BN, BM, USE_ASM, ACT_CG)
        else:
            # The CUDA-core product has no tensor-core operand for Triton's
            # pipeliner to stream the loads through, and the launch's
            # num_stages alone streams nothing: ask for the stages here
            # (in the sm_90 SASS: STAGES - 1 shared-memory buffers, STAGES - 2
            # groups of loads in flight while one is multiplied).
            for g in tl.range(gs, ge, num_stages=STAGES):
                acc, xs_next = _group_step(acc, xs_next, arena_ptr, p0, p1, p2, p3, p4, ps, g, g1, c4, zero,
                                           inv_step, xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride,
                                           qs_ptrs, XS_SUB, NF, BN, BM, USE_ASM, ACT_CG)
        gs = ge
    return acc


@triton.jit
def block_matmul_any(nf, arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
                     xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, qs_ptrs,
                     XS_SUB: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                     USE_ASM: tl.constexpr, STAGES: tl.constexpr, ACT_CG: tl.constexpr = False):
    """block_matmul specialised on the block's run-time field count nf (1..5)."""
    args = (arena_ptr, pt_blk_ptr, pt_field_stride, n_rows, K, rows, g0, g1, log2p,
            xt_ptrs, xt_mask, xs_ptrs, xs_mask, xs_group_stride, plane_off, qs_ptrs)
    if nf == 1:
        acc = block_matmul(*args, XS_SUB, 1, BN, BM, USE_ASM, STAGES, ACT_CG)
    elif nf == 2:
        acc = block_matmul(*args, XS_SUB, 2, BN, BM, USE_ASM, STAGES, ACT_CG)
    elif nf == 3:
        acc = block_matmul(*args, XS_SUB, 3, BN, BM, USE_ASM, STAGES, ACT_CG)
    elif nf == 4:
        acc = block_matmul(*args, XS_SUB, 4, BN, BM, USE_ASM, STAGES, ACT_CG)
    else:
        acc = block_matmul(*args, XS_SUB, 5, BN, BM, USE_ASM, STAGES, ACT_CG)
    return acc
