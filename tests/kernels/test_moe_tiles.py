"""Launch shapes of the fused MoE kernels: MoeTiles' checks and choose_tiles'
choices per token count, model and tuning (no kernel runs)."""

import pytest
import torch

from kernels.moe_tile_choice import choose_tiles
from kernels.moe_tiles import MoeTiles
from kernels.moe_tuning import GATE_UP_INTERLEAVE_MAX_TOKENS, WIDE_GATE_UP_SPLIT_STAGES, MoeTuning


def test_gate_up_split_only_with_a_wide_tile():
    # MoeTuning.wide_gate_up_split_stages reaches the tiles only where a
    # wide tile is compiled in (Mixtral B=64), and only from the tuning.
    with pytest.raises(ValueError, match="gate_up_split_stages"):
        MoeTiles(block_m=16, gate_up_split_stages=4)
    with pytest.raises(ValueError, match="gate_up_split_stages"):
        MoeTiles(block_m=16, block_m_wide=32, gate_up_split_stages=-1)
    with pytest.raises(ValueError, match="wide_gate_up_split_stages"):
        MoeTuning(wide_gate_up_split_stages=-1)
    split = MoeTuning(wide_gate_up_split_stages=3)
    assert choose_tiles(64, 2, 8, 4096, 14336, tuning=split).gate_up_split_stages == 3
    assert choose_tiles(64, 2, 8, 4096, 14336).gate_up_split_stages == WIDE_GATE_UP_SPLIT_STAGES > 0
    one = MoeTuning(wide_gate_up_split_stages=0)
    assert choose_tiles(64, 2, 8, 4096, 14336, tuning=one).gate_up_split_stages == 0
    assert choose_tiles(32, 2, 8, 4096, 14336, tuning=split).gate_up_split_stages == 0  # no wide tile
    with pytest.raises(ValueError, match="down_split_stages"):
        MoeTiles(block_m=16, down_split_stages=4)
    with pytest.raises(ValueError, match="balance_down"):
        MoeTiles(block_m=16, block_m_wide=32, balance_down=True, down_split_stages=4)
    with pytest.raises(ValueError, match="wide_down_split_stages"):
        MoeTuning(wide_down_split_stages=-1)
    assert choose_tiles(64, 2, 8, 4096, 14336).down_split_stages == 0  # off: measured slower (WIDE_DOWN_SPLIT_STAGES)
    down = MoeTuning(wide_down_split_stages=4)
    assert choose_tiles(64, 2, 8, 4096, 14336, tuning=down).down_split_stages == 4
    assert choose_tiles(32, 2, 8, 4096, 14336, tuning=down).down_split_stages == 0  # no wide tile
    tiles = MoeTiles(block_m=16, block_m_wide=32, num_stages=3, gate_up_split_stages=4)
    assert tiles.launch_options()["num_stages"] == 3 and tiles.launch_options(4)["num_stages"] == 4


def test_tiles_validate_and_widen_only_when_needed():
    with pytest.raises(ValueError, match="block_m_wide"):
        MoeTiles(block_m=32, block_m_wide=32)
    with pytest.raises(ValueError, match="block_m "):
        MoeTiles(block_m=24)
    # Up to tuning.narrow_tile_max_mean tokens per expert (Mixtral B <= 16)
    # the 8-token tile, without a wide tile; then 16 tokens.
    narrow = choose_tiles(16, 2, 8, 4096, 14336)
    assert (narrow.block_m, narrow.block_m_wide, narrow.activation_dtype) == (8, 0, torch.float16)
    assert narrow.balance_down  # shared down work, but not with the wide tile
    assert choose_tiles(4, 2, 8, 4096, 14336).block_m == 8
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_max_mean=0)).block_m == 16
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_max_mean=0)).block_m_wide == 0
    assert choose_tiles(2, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_max_mean=0)).block_m == 16
    # The narrow tile stages the planes in its own order: never a wide tile.
    assert (choose_tiles(24, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_max_mean=6)).block_m_wide) == 0
    with pytest.raises(ValueError, match="slot order"):
        MoeTiles(block_m=8, block_m_wide=16)
    b32 = choose_tiles(32, 2, 8, 4096, 14336)
    assert (b32.block_m, b32.block_m_wide) == (16, 0)  # mean 8 per expert: rarely over 16
    assert narrow.narrow_order and not b32.narrow_order and not choose_tiles(1, 2, 8, 4096, 14336).narrow_order
    wide = choose_tiles(64, 2, 8, 4096, 14336)
    assert (wide.block_m, wide.block_m_wide) == (16, 32) and not wide.balance_down
    assert choose_tiles(64, 2, 8, 4096, 14336, block_m_wide=0).block_m_wide == 0
    assert choose_tiles(64, 4, 60, 2048, 1408).block_m_wide == 0  # Qwen: mean 4.3 tokens per expert
    assert not choose_tiles(16, 4, 60, 2048, 1408).balance_down  # 60 experts: the plan walk costs more
    assert choose_tiles(256, 2, 8, 4096, 14336).block_m_wide == 0  # 64-token tiles already
    # One token: the CUDA-core tile, one row per thread, int16 activations;
    # 64 rows where 128 would leave multiprocessors idle in gate/up (Qwen).
    one = choose_tiles(1, 2, 8, 4096, 14336)
    assert (one.block_m, one.block_n_up, one.block_n_down, one.num_warps) == (1, 128, 128, 4)
    assert one.activation_dtype == torch.int16 and one.block_m_wide == 0
    qwen = choose_tiles(1, 4, 60, 2048, 1408)
    assert (qwen.block_m, qwen.block_n_up, qwen.block_n_down, qwen.num_warps) == (1, 64, 64, 2)
    assert choose_tiles(2, 2, 8, 4096, 14336).activation_dtype == torch.float16
    assert choose_tiles(1, 2, 8, 4096, 14336, block_m=16).block_m == 16
    # Pipeline depth: per tile kind from the tuning unless given.
    shipped = MoeTuning()
    assert one.num_stages == shipped.one_token_stages and wide.num_stages == shipped.wide_launch_stages
    assert choose_tiles(16, 2, 8, 4096, 14336).num_stages == shipped.narrow_tile_stages
    assert b32.num_stages == shipped.tensor_core_stages
    assert choose_tiles(256, 2, 8, 4096, 14336).num_stages == shipped.wide_launch_stages  # 64-token tiles
    assert wide.wide_loop_stages == shipped.wide_tile_stages and one.wide_loop_stages == one.num_stages
    tuned = MoeTuning(one_token_stages=2, tensor_core_stages=5, wide_launch_stages=6, wide_tile_stages=7,
                      one_token_maxnreg=200)
    one_tuned = choose_tiles(1, 2, 8, 4096, 14336, tuning=tuned)
    assert (one_tuned.num_stages, one_tuned.maxnreg) == (2, 200)
    assert choose_tiles(32, 2, 8, 4096, 14336, tuning=tuned).num_stages == 5
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_stages=6)).num_stages == 6
    # The narrow tile's register cap reaches its launches and sizes the down
    # split by the programs it lets reside; other tiles keep theirs.
    capped = choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_maxnreg=128))
    uncapped = choose_tiles(16, 2, 8, 4096, 14336)
    assert (capped.maxnreg, capped.resident_programs, uncapped.maxnreg) == (128, 4, shipped.narrow_tile_maxnreg)
    assert capped.launch_options()["maxnreg"] == 128 and capped.split_k > uncapped.split_k
    assert choose_tiles(32, 2, 8, 4096, 14336, tuning=MoeTuning(narrow_tile_maxnreg=128)).maxnreg is None
    with pytest.raises(ValueError, match="narrow_tile_maxnreg"):
        MoeTuning(narrow_tile_maxnreg=256)
    with pytest.raises(ValueError, match="narrow_tile_max_mean"):
        MoeTuning(narrow_tile_max_mean=-1)
    wide_tuned = choose_tiles(64, 2, 8, 4096, 14336, tuning=tuned)
    assert (wide_tuned.num_stages, wide_tuned.wide_loop_stages, wide_tuned.maxnreg) == (6, 7, None)
    with pytest.raises(ValueError, match="tensor_core_stages"):
        MoeTuning(tensor_core_stages=0)
    with pytest.raises(ValueError, match="one_token_maxnreg"):
        MoeTuning(one_token_maxnreg=256)
    # Two rows a thread: half the warps, and the programs the registers allow
    # (255 each: 4 of 2 warps) counted for the carveout and the down split.
    two = choose_tiles(1, 2, 8, 4096, 14336, tuning=MoeTuning(one_token_rows_per_thread=2))
    assert (two.block_n_up, two.num_warps, two.maxnreg, two.resident_programs, two.split_k) == (128, 2, 255, 4, 8)
    assert choose_tiles(1, 4, 60, 2048, 1408, tuning=MoeTuning(one_token_rows_per_thread=2)).num_warps == 1
    assert choose_tiles(16, 2, 8, 4096, 14336, tuning=MoeTuning(one_token_rows_per_thread=2)).num_warps == 4
    with pytest.raises(ValueError, match="one_token_rows_per_thread"):
        MoeTuning(one_token_rows_per_thread=3)
    split_depths = choose_tiles(64, 2, 8, 4096, 14336, num_stages=4, wide_stages=3)
    assert (split_depths.num_stages, split_depths.wide_loop_stages) == (4, 3)
    with pytest.raises(ValueError, match="wide_stages"):
        MoeTiles(wide_stages=-1)
    with pytest.raises(ValueError, match="num_stages"):
        MoeTiles(num_stages=0)
    assert choose_tiles(1, 2, 8, 4096, 14336, num_stages=2).num_stages == 2
    # Resident programs: measured for the compiler's registers, else from the
    # cap; the down split fills them (Mixtral B=1: 32 row tiles x 2 experts).
    assert (one.resident_programs, one.split_k) == (2, 4)
    capped = choose_tiles(1, 2, 8, 4096, 14336, maxnreg=168)
    assert (capped.maxnreg, capped.resident_programs, capped.split_k) == (168, 3, 6)
    assert MoeTiles(maxnreg=128, num_warps=4).resident_programs == 4
    assert MoeTiles(maxnreg=255, num_warps=4).resident_programs == 2  # 256 a thread: 64 Ki exactly
    assert MoeTiles(maxnreg=24, num_warps=8).resident_programs == 8  # threads, not registers (10), bound it


def test_gate_up_interleave_follows_the_token_limit():
    for bad in (True, -1, 1.5, "32", None):
        with pytest.raises(ValueError, match="gate_up_interleave_max_tokens"):
            MoeTuning(gate_up_interleave_max_tokens=bad)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="gate_up_interleave"):
            MoeTiles(gate_up_interleave=bad)
    limit = GATE_UP_INTERLEAVE_MAX_TOKENS
    assert MoeTuning().gate_up_interleave_max_tokens == limit
    # one-token, narrow, 16-token and wide-tile launches on either side of the limit
    for tokens in (1, 4, 16, limit, limit + 1, 64):
        shipped = choose_tiles(tokens, 2, 8, 4096, 14336)
        assert shipped.gate_up_interleave == (tokens <= limit)
        assert not choose_tiles(tokens, 2, 8, 4096, 14336,
                                tuning=MoeTuning(gate_up_interleave_max_tokens=0)).gate_up_interleave
        assert choose_tiles(tokens, 2, 8, 4096, 14336,
                            tuning=MoeTuning(gate_up_interleave_max_tokens=64)).gate_up_interleave

def test_cuda_core_tile_follows_the_token_limit():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="cuda_core_max_tokens"):
            MoeTuning(cuda_core_max_tokens=bad)
    assert MoeTuning().cuda_core_max_tokens == 1
    up_to_3 = MoeTuning(cuda_core_max_tokens=3)
    for tokens in (1, 2, 3, 4):
        shipped = choose_tiles(tokens, 2, 8, 4096, 14336, use_asm=True)
        widened = choose_tiles(tokens, 2, 8, 4096, 14336, use_asm=True, tuning=up_to_3)
        assert (shipped.block_m == 1) == (tokens == 1)
        assert (widened.block_m == 1) == (tokens <= 3)
        if tokens <= 3:
            # the one-token tile as B=1 takes it: no wide tile, no apart launch, a row per thread
            assert widened.block_m_wide == 0 and not widened.gate_up_apart
            assert widened.num_warps * 32 == widened.block_n_up
    # Qwen1.5-MoE's small experts: 64 rows where 128 would leave multiprocessors
    # idle (B=1: 4 experts x 11 row tiles x 2 blocks < 132), 128 at B=4 (16 experts)
    widest = MoeTuning(cuda_core_max_tokens=4)
    rows = [choose_tiles(t, 4, 60, 2048, 1408, use_asm=True, tuning=widest).block_n_up for t in (1, 4)]
    assert rows == [64, 128]


def test_one_token_down_split_counts_the_programs_asked_for():
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="one_token_down_programs"):
            MoeTuning(one_token_down_programs=bad)
    with pytest.raises(ValueError, match="down_by_registers"):
        MoeTiles(down_by_registers=1)
    three = MoeTuning(one_token_down_programs=3)
    # Mixtral B=1 on 132 multiprocessors: 2 x 32 row tiles of H; 2 programs
    # each -> 264 places, split 4; 3 each -> 396 places, split 6
    shipped = choose_tiles(1, 2, 8, 4096, 14336, num_sms=132, use_asm=True)
    asked = choose_tiles(1, 2, 8, 4096, 14336, num_sms=132, use_asm=True, tuning=three)
    assert (shipped.split_k, shipped.down_by_registers) == (4, False)
    assert (asked.split_k, asked.down_by_registers) == (6, True)
    assert asked.split_up == shipped.split_up and asked.resident_programs == shipped.resident_programs
    # tensor-core tiles keep their split
    for tokens in (4, 16, 64):
        plain = choose_tiles(tokens, 2, 8, 4096, 14336, num_sms=132)
        tuned = choose_tiles(tokens, 2, 8, 4096, 14336, num_sms=132, tuning=three)
        assert tuned == plain and not tuned.down_by_registers
