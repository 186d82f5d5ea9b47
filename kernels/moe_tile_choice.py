"""The launch shape (kernels/moe_tiles.MoeTiles) that the fused MoE kernels
take for a batch: choose_tiles, from the batch's tokens, the model's shapes,
the multiprocessors and the measured defaults of kernels/moe_tuning.py.
"""

from __future__ import annotations

from dataclasses import replace

import triton

from kernels.moe_tiles import BALANCE_MAX_EXPERTS, BASE_TOKEN_TILE, CUDA_CORE_ROWS_PER_WARP, CUDA_CORE_TOKEN_TILE, \
    DEFAULT_SMS, MIN_GROUPS_PER_RANGE, NARROW_TOKEN_TILE, TENSOR_CORE_WARPS, WIDE_TOKEN_TILE, MoeTiles, \
    resident_programs
from kernels.moe_tuning import MAX_REGISTERS_PER_THREAD, MoeTuning
from kernels.weight_layout import GROUP


def default_stages(block_m: int, block_m_wide: int, tuning: MoeTuning) -> int:
    """choose_tiles' pipeline depth for a token tile of block_m tokens with a
    wide tile of block_m_wide (0: none) compiled in."""
    if block_m == CUDA_CORE_TOKEN_TILE:
        return tuning.one_token_stages
    if block_m == NARROW_TOKEN_TILE:  # never with a wide tile (MoeTiles)
        return tuning.narrow_tile_stages
    if block_m <= BASE_TOKEN_TILE and not block_m_wide:
        return tuning.tensor_core_stages
    return tuning.wide_launch_stages


def choose_tiles(num_tokens: int, top_k: int, num_experts: int, hidden: int, ffn: int,
                 num_sms: int = DEFAULT_SMS, use_asm: bool = False, block_n: int | None = None,
                 num_stages: int | None = None, num_warps: int | None = None, maxnreg: int | None = None,
                 wide_stages: int | None = None, tuning: MoeTuning | None = None,
                 block_m: int | None = None, block_m_wide: int | None = None,
                 limit_carveout: bool = True, balance_down: bool | None = None) -> MoeTiles:
    """A launch shape for decode sizes: 8-64 tokens per tile, enough programs;
    one token (up to tuning.cuda_core_max_tokens): the CUDA-core tile, one row
    per thread (num_warps follows the rows, 64 where 128 would leave
    multiprocessors idle in gate/up).

    block_n: rows per program (64, 128 or 256; more amortizes more
    per-iteration work, fewer gives more programs; None: 128, or for the
    tensor-core tiles tuning.tensor_core_rows where the shapes divide and
    gate/up fills num_sms); gate/up drops to 64 rows when 128 would leave
    multiprocessors idle. num_warps (None): TENSOR_CORE_WARPS per 128 rows.
    num_stages: pipeline depth (None: default_stages); wide_stages: that of
    the wide tile's loops (None: tuning.wide_tile_stages); maxnreg (None:
    tuning.one_token_maxnreg for the one-token tile,
    tuning.narrow_tile_maxnreg for the 8-token one, else none); tuning: the
    measured defaults (None: MoeTuning()).
    block_m: tokens per tile (None: from the mean tokens per expert:
    NARROW_TOKEN_TILE up to tuning.narrow_tile_max_mean, else the least of
    16, 32, 64 that holds the mean). block_m_wide (None: when the mean load
    is over half a tile, so that some expert likely gets more than block_m
    tokens, WIDE_TOKEN_TILE; never with the narrow tile, else 0): see
    MoeTiles.
    """
    tuning = tuning or MoeTuning()
    pairs = num_tokens * top_k
    active = min(num_experts, pairs)
    per_expert = pairs / active
    one_token = block_m is None and num_tokens <= tuning.cuda_core_max_tokens
    if one_token:
        block_m, block_m_wide = CUDA_CORE_TOKEN_TILE, 0
        if maxnreg is None:
            maxnreg = tuning.one_token_maxnreg
    if block_m is None and per_expert <= tuning.narrow_tile_max_mean:
        block_m = NARROW_TOKEN_TILE
    if block_m == NARROW_TOKEN_TILE and maxnreg is None:
        maxnreg = tuning.narrow_tile_maxnreg
    if block_m is None:
        block_m = BASE_TOKEN_TILE
        while block_m < per_expert and block_m < 4 * BASE_TOKEN_TILE:
            block_m *= 2
    if block_m_wide is None:
        # The wide tile slows every step of the launch, so it is compiled in
        # only where it likely pays: Mixtral at B=32 (mean 8 tokens per
        # expert, random routing) ran 395 us with it and 355 us without; at
        # B=64 (mean 16) 431 us with it and 570 us without.
        likely_over = per_expert > block_m / 2 and block_m != NARROW_TOKEN_TILE
        block_m_wide = WIDE_TOKEN_TILE if likely_over and WIDE_TOKEN_TILE > block_m else 0
    if num_stages is None:
        num_stages = default_stages(block_m, block_m_wide, tuning)
    if wide_stages is None:
        wide_stages = tuning.wide_tile_stages if block_m_wide else 0
    if balance_down is None:
        # Not with the wide tile: there Triton 3.6 keeps fewer address words
        # in registers and the 16-token loops grow (4-bit: 429 -> 461
        # instructions per step in the SASS). Not for many experts either
        # (BALANCE_MAX_EXPERTS).
        balance_down = block_m_wide == 0 and num_experts <= BALANCE_MAX_EXPERTS
    if block_n is None:
        rows = tuning.tensor_core_rows
        fits = not hidden % rows and not ffn % rows and 2 * (ffn // rows) * active >= num_sms
        block_n = rows if block_m != CUDA_CORE_TOKEN_TILE and fits else GROUP
    if num_warps is None:
        num_warps = TENSOR_CORE_WARPS * max(1, block_n // GROUP)
    half = GROUP // 2
    block_n_up = block_n if 2 * (ffn // block_n) * active >= num_sms or ffn % half else half
    if one_token:
        # tuning.one_token_rows_per_thread rows per thread in both launches:
        # num_warps follows the rows.
        rows_per_thread = tuning.one_token_rows_per_thread
        block_n, num_warps = block_n_up, block_n_up // (CUDA_CORE_ROWS_PER_WARP * rows_per_thread)
        if rows_per_thread > 1 and maxnreg is None:
            # The compiler takes every register it may (255 at 2 rows): with
            # that as the cap, resident_programs counts what fits (4 programs
            # of 2 warps), and the carveout and the down split follow.
            maxnreg = MAX_REGISTERS_PER_THREAD
    tiles_down = triton.cdiv(hidden, block_n) * active
    # One wave: a split that overfills the multiprocessors by a few programs
    # costs a whole second round (Mixtral B=1: 5 splits = 320 programs for 264
    # slots), so round down.
    down_by_registers = one_token and tuning.one_token_down_programs > 0
    programs = tuning.one_token_down_programs if down_by_registers else resident_programs(maxnreg, num_warps)
    split = max(1, min(ffn // GROUP, programs * num_sms // tiles_down))
    apart = block_m != CUDA_CORE_TOKEN_TILE and num_tokens <= tuning.gate_up_apart_max_tokens
    tiles = MoeTiles(block_n_up=block_n_up, block_n_down=block_n, block_m=block_m, split_k=split,
                     num_stages=num_stages, wide_stages=wide_stages, num_warps=num_warps, use_asm=use_asm,
                     maxnreg=maxnreg,
                     block_m_wide=block_m_wide, limit_carveout=limit_carveout,
                     balance_down=balance_down, down_group_cost=tuning.down_group_cost,
                     down_zigzag=tuning.down_zigzag,
                     gate_up_interleave=num_tokens <= tuning.gate_up_interleave_max_tokens,
                     gate_up_split_stages=tuning.wide_gate_up_split_stages if block_m_wide else 0,
                     down_split_stages=tuning.wide_down_split_stages if block_m_wide and not balance_down else 0,
                     gate_up_apart=apart,
                     gate_up_maxnreg=tuning.base_tile_gate_up_maxnreg if apart and block_m == BASE_TOKEN_TILE else None,
                     gate_up_sums_fp16=apart and tuning.gate_up_sums_fp16,
                     combine_one_plane=apart and tuning.combine_one_plane,
                     down_by_registers=down_by_registers)
    if tuning.one_token_one_launch and tiles.fits_one_launch:
        return replace(tiles, one_launch=True, gate_up_apart=False)
    if one_token:
        # Up to tuning.one_token_split_up K ranges, as many as one wave of
        # resident programs holds (rounded down, as the down split), each of
        # at least MIN_GROUPS_PER_RANGE groups.
        fill = tiles.resident_programs * num_sms // (2 * (ffn // block_n_up) * active)
        most = hidden // (GROUP * MIN_GROUPS_PER_RANGE)
        return replace(tiles, split_up=max(1, min(tuning.one_token_split_up, fill, most)))
    return tiles
