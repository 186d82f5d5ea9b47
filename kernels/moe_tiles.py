"""Launch shapes of the fused MoE kernels (kernels/moe_mixed.py): how many
rows and tokens a program takes, the K split of the down launch, and the
compiler options. Policy only; the kernels take whatever shape they are given.
kernels/moe_tile_choice.py chooses a shape for a batch (choose_tiles).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.moe_tuning import DOWN_GROUP_COST, MAX_REGISTERS_PER_THREAD, check_bool, check_down_group_cost, \
    check_down_zigzag
from kernels.weight_layout import GROUP

DEFAULT_SMS = 132
# The base tensor-core token tile (choose_tiles' tile for a mean load from
# MoeTuning.narrow_tile_max_mean up to 16 tokens per expert); the largest
# tile is four times this.
BASE_TOKEN_TILE = 16
# The narrow tensor-core tile: 8 tokens, by mma.sync (Triton 3.6 takes wgmma
# from 16 up; kernels/moe_decode.tile_k_order). Session 1 measured it much
# slower (benchmarks/results/moe_tile8_h200.json): then Triton moved each
# decoded tile through shared memory into mma.sync's operand layout. In the
# Gluon probe of session 33 an 8-token step ran 76-83 % of the copy against
# 63-69 % at 16 (benchmarks/results/gluon_ws_probe_h200_s33.json). Its
# launches stage the activation planes in its own slot order
# (weight_layout.slot_virtual), so no wider tile can share them: a launch
# with this tile has no wide tile.
NARROW_TOKEN_TILE = 8
# The one-token tile: its products run on the CUDA cores
# (kernels/moe_cuda_core.py), one weight row per thread, against int16
# activations. For launches where no expert can get a second token (one
# token). us per layer at B=1, 2 / 4 / 8 bits / mixed 2-6, tensor cores ->
# this tile with fp32 products (session 13) -> with dp2a (session 14):
# Mixtral 88.3 / 106.2 / 134.0 / 113.8 -> 76.7 / 89.3 / 127.0 / 99.7 -> 67.7
# / 81.3 / 115.3 / 87.5 (128 rows, 4 warps), Qwen1.5-MoE 24.9 / 28.2 / 32.9 /
# 30.0 -> 23.5 / 25.8 / 33.0 / 27.2 -> 20.7 / 23.2 / 27.3 / 24.6 (64 rows, 2
# warps) (benchmarks/results/moe_h200_s13_b1*.json, moe_h200_s14_b1*.json).
# A thread on half a row (64 rows on 4 warps, 128 on 8) ran 1.1-2.2x slower
# than the tensor cores (benchmarks/results/moe_cuda_core_tile_h200.json);
# 64 rows with dp2a ran as 128 (moe_tune_b1_s14_h200.json).
CUDA_CORE_TOKEN_TILE = 1
CUDA_CORE_ROWS_PER_WARP = 32
# Warps of a tensor-core program per 128 weight rows (8 warps on 128 rows
# ran 10-20 % slower, benchmarks/NOTES.md session 3; 64 rows keep 4).
TENSOR_CORE_WARPS = 4
# Resident programs per multiprocessor when the compiler picks the registers
# (MoeTiles.maxnreg None): both weight kernels use 225-255 registers per
# thread at 4 warps (ncu on the H200: "Block Limit Registers 2"). Programs
# of other warp counts are counted at 255 registers a thread instead (4 of 2
# warps: the one-token tile of 64 rows, Qwen1.5-MoE at B=1; 1 of 8 warps).
PROGRAMS_PER_SM = 2
PROGRAMS_PER_SM_WARPS = 4
# What a register cap allows instead (MoeTiles.resident_programs): the
# H200's register file per multiprocessor, and the granularity in which a
# thread's registers are allocated.
REGISTERS_PER_SM = 65536
REGISTER_GRANULE = 8
THREADS_PER_SM = 2048
# Token tile for experts over the base tile (MoeTiles.block_m_wide). 32: at
# Mixtral B=64 with random routing (4 of 8 experts over 16 tokens) a 32-token
# tile for all experts cut the layer from 570 to 441 us against 16, a
# 64-token one took 680 us (benchmarks/results/moe_block_m_random_h200.json).
WIDE_TOKEN_TILE = 32
# The balanced down split (MoeTiles.balance_down) for at most this many
# experts: every program walks the plan of all active experts first. Mixtral
# (8 experts), B=16: mixed 2/6 329.6 us with it, 335.4 without, uniform views
# within 1.3 %; Qwen1.5-MoE (60), B=16: 221.6 / 249.5 / 258.5 us (2-bit /
# 4-bit / mixed) with it, 130.5 / 159.7 / 159.8 without
# (benchmarks/results/moe_tune_*_s11_h200.json). 16 is the plan's narrowest
# row (down_plan_width), not a measured crossing point.
BALANCE_MAX_EXPERTS = 16
# Fewest K groups in one range of a split one-token gate/up row tile
# (MoeTiles.split_up): measured only with 5-8 (Qwen1.5-MoE, 16 groups in 2
# or 3 ranges, benchmarks/NOTES.md session 46); a model with fewer groups
# (the default model: 2) is not split.
MIN_GROUPS_PER_RANGE = 4


@dataclass(frozen=True)
class MoeTiles:
    """Launch shape. split_k 0 = fill the GPU.

    block_n_up / block_n_down: weight rows per program of the gate/up and
    down launches. block_n_up over 128 (tensor-core tiles only) reads each
    activation tile once for more weight rows: the 16-token tile's
    activations are 4 KiB a step against 8.7 KiB of 4-bit (4.6 KiB of 2-bit)
    weights at 128 rows, all from the L2. Measured slower at 256 rows
    (moe_tuning.TENSOR_CORE_ROWS).

    num_stages: pipeline depth of the K loops (kernels/moe_block_matmul.py
    STAGES; also the launches' num_stages option).
    wide_stages: pipeline depth of the block_m_wide loops (0: num_stages).
    Both tiles' loops are in one launch, whose shared memory is the larger
    of their needs.
    use_asm: split byte lanes into fp16 pairs with the PTX byte permute (GPU
    only; the interpreter cannot run inline assembly).
    maxnreg: cap on registers per thread (more programs per multiprocessor,
    at the risk of spills); None leaves it to the compiler.
    limit_carveout: after loading a launch over 48 KiB of shared memory, ask
    the driver for only the carveout that resident_programs programs need,
    so that L1 keeps the rest (kernels/smem_carveout.py); GPU only.
    block_m: tokens per tile: a power of two >= NARROW_TOKEN_TILE (tensor
    cores, fp16 activation planes) or CUDA_CORE_TOKEN_TILE (CUDA cores, int16
    activations: activation_dtype); any token count is correct with either,
    the tile only sets the speed.
    block_m_wide: token tile for experts with more than block_m tokens (0 =
    none). Such an expert then streams its weights once per block_m_wide
    tokens instead of once per block_m; the others keep the cheaper block_m
    steps. Both tiles are compiled into each launch, which costs the block_m
    steps ~4 % (Mixtral B=64 4-bit with equal loads: 373.9 vs 358.8 us; it
    was 10-13 % before the carveout limit and the narrow-first code order)
    but saves a pass over the weights of every expert over block_m tokens
    (random routing at B=64: 426 vs 570 us). As two launches, one per tile,
    each launch left half the GPU idle in the down projection (531 us).
    balance_down: the down launch's programs share each row tile's work by
    view cost (down_group_cost: one per view, 1..5 fields), so that in a mixed
    state no program holds a whole K range of a wide view while others idle;
    False: split_k equal K ranges per expert. down_zigzag: the experts laid
    end to end costliest, cheapest, second costliest, ... instead of
    costliest first. gate_up_interleave: the gate/up launch's programs
    numbered row tile major, every active expert's program of a row tile
    together, instead of expert major (MoeTuning.gate_up_interleave_max_tokens).
    one_launch: gate/up and down in one launch whose down programs start as
    their h tiles are stored (kernels/moe_gate_up_down.py); only for the
    one-token tile without a wide tile and block_n_up == block_n_down.
    split_up: K ranges of each gate/up row tile, one program each (partial
    sums in the workspace, added in K order by the last to arrive): more
    programs, each with a shorter K loop, where the row tiles alone leave
    multiprocessors idle (one token, few small experts); only for the
    one-token tile in its own launch.
    gate_up_split_stages: with a wide tile, the gate/up projection as two
    launches, each compiled for one token tile: the experts of at most
    block_m tokens at this pipeline depth, the others on the wide tile at
    wide_loop_stages (0: one launch with both tiles). Compiled in but unused,
    the wide tile costs the base tile's loops 5-8 % (benchmarks/NOTES.md,
    session 53). On a GPU the two run at once on two streams
    (kernels/moe_gate_up.run_gate_up): one after the other, each one's tail
    left the GPU idle (MoeTuning's WIDE_GATE_UP_SPLIT_STAGES has both).
    down_split_stages: the same split of the down launch (0: one launch;
    not with balance_down, whose plan shares all experts' work).
    gate_up_apart: each gate/up program takes one token tile and stores its
    partial sums only; a combine launch (kernels/moe_combine.py) makes h.
    Needs each token's top-k ids distinct (a router's top-k): the grid holds
    the token tiles of num_tokens pairs per expert. Not with one_launch;
    choose_tiles takes it for the tensor-core tiles up to
    MoeTuning.gate_up_apart_max_tokens tokens. gate_up_maxnreg: register
    cap of the gate/up launches compiled for block_m alone (no wide tile in
    them; None: maxnreg); their carveout follows their compiled registers.
    down_by_registers: the down launch's carveout allows as many programs as
    its compiled registers do, where that is more than resident_programs
    (choose_tiles' one-token split with MoeTuning.one_token_down_programs).
    gate_up_sums_fp16: the gate/up launch stores its partial sums (gu) in
    fp16, clamped to its finite range, instead of fp32; the combine adds
    them in fp32. combine_one_plane: the combine launch stores only the h
    plane that each expert's down view reads (weight_layout.view_plane).
    """

    block_n_up: int = 128
    block_n_down: int = 128
    block_m: int = BASE_TOKEN_TILE
    split_k: int = 0
    num_warps: int = 4
    num_stages: int = 3
    wide_stages: int = 0
    use_asm: bool = False
    maxnreg: int | None = None
    block_m_wide: int = 0
    limit_carveout: bool = True
    balance_down: bool = False
    one_launch: bool = False
    split_up: int = 1
    down_group_cost: tuple[int, ...] = DOWN_GROUP_COST
    down_zigzag: bool = False
    gate_up_interleave: bool = False
    gate_up_split_stages: int = 0
    down_split_stages: int = 0
    gate_up_apart: bool = False
    gate_up_maxnreg: int | None = None
    down_by_registers: bool = False
    gate_up_sums_fp16: bool = False
    combine_one_plane: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "down_group_cost", check_down_group_cost(self.down_group_cost))
        check_down_zigzag(self.down_zigzag)
        check_bool("gate_up_interleave", self.gate_up_interleave)
        check_bool("gate_up_apart", self.gate_up_apart)
        check_bool("down_by_registers", self.down_by_registers)
        for name in ("gate_up_sums_fp16", "combine_one_plane"):
            check_bool(name, getattr(self, name))
        cap = self.gate_up_maxnreg
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)
                                or not 0 < cap <= MAX_REGISTERS_PER_THREAD):
            raise ValueError(f"gate_up_maxnreg must be None or in 1..{MAX_REGISTERS_PER_THREAD}, got {cap!r}")
        if self.gate_up_apart and self.one_launch:
            raise ValueError("gate_up_apart needs gate/up in its own launch (one_launch False)")
        for name in ("block_m", "block_n_up", "block_n_down"):
            value = getattr(self, name)
            if name == "block_m" and value == CUDA_CORE_TOKEN_TILE:
                continue
            least = NARROW_TOKEN_TILE if name == "block_m" else BASE_TOKEN_TILE
            if value < least or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= {least}, got {value}")
        wide = self.block_m_wide
        if wide and (wide <= self.block_m or wide & (wide - 1)):
            raise ValueError(f"block_m_wide must be 0 or a power of two > block_m, got {wide}")
        if wide and self.narrow_order:
            raise ValueError(f"block_m {self.block_m} stages the activations in its own slot order: "
                             f"no wide tile can read them (block_m_wide must be 0, got {wide})")
        if self.block_n_up > GROUP and self.block_m == CUDA_CORE_TOKEN_TILE:
            raise ValueError(f"block_n_up over {GROUP} needs a tensor-core tile, got {self.block_n_up} with "
                             f"block_m {self.block_m}")
        if self.one_launch and not self.fits_one_launch:
            raise ValueError("one_launch needs block_m 1, no wide tile and block_n_up == block_n_down")
        if self.split_up < 1:
            raise ValueError(f"split_up must be >= 1, got {self.split_up}")
        if self.split_up > 1 and (self.block_m != CUDA_CORE_TOKEN_TILE or self.one_launch):
            raise ValueError("split_up > 1 needs the one-token tile (block_m 1) in its own gate/up launch")
        for name in ("gate_up_split_stages", "down_split_stages"):
            stages = getattr(self, name)
            if stages < 0 or (stages and not wide):
                raise ValueError(f"{name} needs a wide tile and must be >= 0, got {stages} with "
                                 f"block_m_wide {wide}")
        if self.down_split_stages and self.balance_down:
            raise ValueError("down_split_stages needs the plain down split (balance_down False)")
        if self.num_stages < 1 or self.wide_stages < 0:
            raise ValueError(f"num_stages must be >= 1 and wide_stages >= 0, got {self.num_stages}, "
                             f"{self.wide_stages}")

    @property
    def fits_one_launch(self) -> bool:
        """Whether gate/up and down may run as one launch (one_launch): the
        one-token tile without a wide tile, one row tile height for both."""
        return (self.block_m == CUDA_CORE_TOKEN_TILE and not self.block_m_wide
                and self.block_n_up == self.block_n_down)

    @property
    def h_sum_rows(self) -> int:
        """Rows of h per activation sum that the gate/up launch writes for
        the down launch: one sum per row tile, or per group where a row tile
        spans several groups (block_n_up > GROUP)."""
        return min(self.block_n_up, GROUP)

    @property
    def narrow_order(self) -> bool:
        """Whether the activation planes are staged in the narrow tile's slot
        order (weight_layout.slot_virtual; MoePrep.narrow_order)."""
        return CUDA_CORE_TOKEN_TILE < self.block_m < BASE_TOKEN_TILE

    @property
    def activation_dtype(self) -> torch.dtype:
        """Element type of the activation planes both weight launches read
        (x planes from the prep launch, h planes from gate/up)."""
        return torch.int16 if self.block_m == CUDA_CORE_TOKEN_TILE else torch.float16

    @property
    def resident_programs(self) -> int:
        """Programs per multiprocessor that the registers allow: PROGRAMS_PER_SM
        (measured) when the compiler picks them, else what maxnreg leaves room
        for. Sizes the down split and the shared-memory carveout, which would
        otherwise hold a capped launch to PROGRAMS_PER_SM."""
        return resident_programs(self.maxnreg, self.num_warps)

    def down_grid(self, num_tokens: int, top_k: int, num_experts: int, hidden: int,
                  ffn: int) -> tuple[int, int]:
        """(row tiles of H, programs per row tile) of the down launch: split_k
        programs per expert slot, which share the row tile's work."""
        slots = min(num_experts, num_tokens * top_k)
        return triton.cdiv(hidden, self.block_n_down), min(max(1, self.split_k), ffn // GROUP) * slots

    @property
    def wide_loop_stages(self) -> int:
        """Pipeline depth of the block_m_wide loops."""
        return self.wide_stages or self.num_stages

    @property
    def down_cost_word(self) -> int:
        """down_group_cost and down_zigzag packed for the down launch's
        DOWN_COSTS constexpr: the cost of view f (f resident fields) in byte
        f - 1, down_zigzag in bit 40. 0 without balance_down,
        whose launch never reads them: costs that differ there must not make
        another compiled variant."""
        if not self.balance_down:
            return 0
        views = sum(c << (8 * i) for i, c in enumerate(self.down_group_cost))
        return views | int(self.down_zigzag) << (8 * len(self.down_group_cost))

    def launch_options(self, num_stages: int | None = None) -> dict:
        """Compiler options of both weight launches (num_stages: a launch's
        own depth, None: self.num_stages)."""
        opts = {"num_warps": self.num_warps, "num_stages": num_stages or self.num_stages}
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts


def resident_programs(maxnreg: int | None, num_warps: int) -> int:
    """MoeTiles.resident_programs for a register cap (None: the compiler's
    choice) and warps per program."""
    if maxnreg is None:
        measured = PROGRAMS_PER_SM if num_warps <= PROGRAMS_PER_SM_WARPS else 0
        return max(measured, resident_programs(MAX_REGISTERS_PER_THREAD, num_warps))
    threads = 32 * num_warps
    per_thread = -(-maxnreg // REGISTER_GRANULE) * REGISTER_GRANULE
    return max(1, min(REGISTERS_PER_SM // (per_thread * threads), THREADS_PER_SM // threads))
