"""MoeTuning: the compiler choices of the fused MoE launches that are set by
measurement rather than derived from the shapes (pipeline depths, register
cap). kernels/moe_tile_choice.choose_tiles reads one; DataplaneConfig.moe_tuning
holds the serving process's, and A/B benchmarks build their own.

The measurements behind each shipped value sit beside it as comments, here
and, for the one-token tile, in kernels/moe_tuning_one_token.py. Imports no
Triton, so that configs can hold one.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.moe_tuning_one_token import CUDA_CORE_MAX_TOKENS, ONE_TOKEN_DOWN_PROGRAMS, ONE_TOKEN_ONE_LAUNCH, \
    ONE_TOKEN_ROWS_PER_THREAD, ONE_TOKEN_SPLIT_UP, ONE_TOKEN_STAGES, ROWS_PER_THREAD_CHOICES

# The shipped values and why (H200, Triton 3.6; benchmarks/results/):
#
# tensor_core_stages: the 16-token tensor-core tile in a launch without a wide
# tile. Mixtral, 3 -> 4 stages at 4 bits (us per layer, 0fdae1d, session 23):
# B=4 312.1 -> 304.5, B=16 314.3 -> 305.9, 8-bit B=16 410.6 -> 405.9; end to
# end B=16 +2.2 / +1.4 / +1.8 % at 4 / 8 / mixed 2-6 bits
# (e2e_h200_s23_tcst*.json). At 4 stages it takes 67 KB of shared memory.
TENSOR_CORE_STAGES = 4
# wide_launch_stages and wide_tile_stages: a launch with the 32-token wide
# tile compiled in (B=64), its 16-token loop and its wide loop. Both at 4
# stages: B=64 342.0 -> 342.5 us per layer, end to end -0.9 to -1.3 %
# (e2e_h200_s23_tcst*.json); the wide tile then takes 84 KB of shared memory,
# a 64-token base tile 116 KB (over half the 228 KB: one program per
# multiprocessor), so wide_launch_stages also covers base tiles over 16 tokens.
# The 16-token loop at 4 with the wide loop at 3 gained nothing either (4-bit
# / 8-bit / mixed 2-6 at B=64, random routing: 387.1 / 491.4 / 391.4 ->
# 387.8 / 498.1 / 394.6 us, moe_tune_wide_stages_b64_s24_h200.json).
WIDE_LAUNCH_STAGES = 3
WIDE_TILE_STAGES = 3
# narrow_tile_max_mean: the 8-token tensor-core tile (mma.sync; its planes in
# its own slot order, weight_layout.slot_virtual) serves launches whose mean
# load per active expert is at most this many tokens, so that an expert
# rarely spills into a second tile (Mixtral top-2 of 8 experts: B <= 16; an
# expert over 8 tokens takes another pass: the narrow tile has no wide one).
# Mixtral-8x7B end to end, tok/s, medians of three interleaved rounds, 16-token
# tile -> this one (399eb5e, e2e_h200_s34_call2.json): 4-bit B=4 478.4 ->
# 535.9, B=16 1432.5 -> 1601.2 (69.7 % of the anchor roofline); 8-bit B=4
# 373.9 -> 383.6, B=16 1108.2 -> 1135.6; mixed 2/6 B=4 472.2 -> 522.1, B=16
# 1415.9 -> 1555.1. The layer, random routing (moe_h200_s34_tiles.json), us:
# 4-bit B=4 162.6 -> 146.9, B=16 305.0 -> 263.8; 8-bit B=16 411.4 -> 394.7;
# 2-bit B=16 249.5 -> 215.0; mixed 2/6 B=16 316.2 -> 275.5. Before its
# planes had their own order (7fae83a: the launches gathered the rows in the
# tile's order, 8 more global loads a step, no cp.async) it was 11-15 %
# slower than the 16-token tile (e2e_h200_s34_call1.json).
NARROW_TILE_MAX_MEAN = 4.0
# narrow_tile_stages: the 8-token tile's K loop. 6 stages against 4, end to
# end (one round beside the three above): 4-bit B=16 1594.5 against 1601.2,
# 8-bit 1115.0 against 1135.6, mixed 2/6 1533.3 against 1555.1; the layer at
# 4-bit B=16 264.8 against 263.8 us.
NARROW_TILE_STAGES = 4
# narrow_tile_maxnreg: register cap of the 8-token tile's launches. Without
# one Triton 3.6 gives both 255 registers (gate/up with 48 bytes of stack): 2
# programs of 4 warps per multiprocessor. Under a cap the loops stay free of
# local memory (local sm_90 SASS, benchmarks/sass_loops.py --block-m 8): at
# 168 (3 programs) the 4-bit gate/up step takes 270 instructions against 261,
# down 282 against 273; at 128 with 3 stages (4 programs: 37.9 KB of shared
# memory each) 271 and 282. Not yet timed on the GPU (session 35 had no
# device; the call to make is in benchmarks/NOTES.md): None until one pays.
NARROW_TILE_MAXNREG = None
# down_group_cost: relative time per weight group of each view (1..5 resident
# fields: 2 / 3 / 4 / 6 / 8 bits) in the down launch, by which its programs
# share a row tile's work when balance_down is on (kernels/moe_down.py). From
# the layer's times per view (Mixtral B=16, 16-token tile,
# benchmarks/results/moe_h200_s10.json: 2 / 3 / 4 / 6 / 8 bits at 255 / 315 /
# 351 / 410 / 478 us, in units of ~32 us). The 8-token tile's down launch
# alone keeps those ratios (Mixtral B=16, H200: 2 / 4 / 6 bits 63.0 / 81.3 /
# 100.5 us, 8 : 10.3 : 12.8), and on mixed states other tables were no faster
# (layer us at B = 16 / 4 / 1, mixed 2/6: these 274.2-274.4 / 269.7-270.4 /
# 71.9-72.0; (8, 10, 9, 13, 14) 275.0 / 269.5 / 72.1; all 1 284.9 / 280.4 /
# 73.2; (8, 11, 13, 18, 22) 288.3 / 282.9 / 74.3;
# moe_down_cost_b16_h200_s47.json). On the H100 too, though its uniform down
# launches run 2 / 4 / 6 bits at 66.6 / 96.9 / 131.7 us (8 : 11.6 : 15.8):
# the table of those ratios, (8, 10, 12, 16, 20), took mixed 2/6 at B = 16 /
# 4 to 317.0 / 312.2 us against these 307.4-308.0 / 301.8-302.5
# (moe_down_cost_h100_s49.json; benchmarks/down_balance_model.py says why the
# uniform times mislead). Flatter tables were faster on the H100 (session 52):
# a whole-expert 6/2 mix at B=32 / 16 (layer us, random routing) 352.7-354.8 /
# 315.3-315.9 with (8, 10, 11, 13, 15), 351.6-352.1 / 312.4-312.6 with 6 bits
# at 12, 349.1 / 309.1 at 11, 346.7-346.9 / 310.0-310.5 with (8, 10, 10, 10,
# 12), dearer 6 bits slower (14: 356.7 / 319.1, 15: 358.7 / 320.9); B=4 flat
# (moe_down_cost_b32{,_cheaper}_h100_s52.json). So the shipped table is the old
# one's spread over the 2-bit view halved (twice the units for resolution):
# 6/2 B=32 / 16 348.1 / 308.9 us, 8/4 B=32 448.8 (451.8-452.8), 8/2 B=16 362.8
# (372.4), 4/3 B=32 325.6 (326.1); end to end mixed 2/6 B=16 1371.9 -> 1386.6
# tok/s, B=32 2452.9 -> 2487.2 (two interleaved rounds; uniform 4-bit 1390.0 /
# 2531.4 in the same call: -0.2 / -1.7 %; moe_down_cost_ab_h100_s52.json,
# e2e_down_cost_ab_h100_s52.json). On the H200, one round (the other ran out of
# time compiling): mixed 2/6 B=1 299.8 against 299.1-300.8, B=4 529.9 against
# 534.1 (e2e_down_cost_small_ab_h200_s52.json); B=4 wants a second round.
DOWN_GROUP_COST = (16, 18, 19, 21, 23)
DOWN_COST_VIEWS = 5  # views 2 / 3 / 4 / 6 / 8 bits (docs/WEIGHT_LAYOUT.md)
DOWN_COST_MAX = 255  # each cost is one byte of MoeTiles.down_cost_word
# gate_up_interleave_max_tokens: the gate/up launches of at most this many
# tokens number their programs row tile major (MoeTiles.gate_up_interleave).
# A state that gives whole experts one width (the planner's, e2e mixed 2/6)
# otherwise runs every wide expert's programs first and every narrow one's
# after, each phase at its own width's pace. End to end on the H100
# (synthetic Mixtral-8x7B, two interleaved rounds; tok/s expert major ->
# row tile major; e2e_gate_up_interleave_h100_s51.json,
# e2e_interleave_b64_ab_h100_s51.json): mixed 2/6 B=1 246.2 -> 248.5, B=4
# 450.6 -> 463.2, B=16 1341.1 -> 1368.8, B=32 2393.6 -> 2420.0, B=64 4160.1
# -> 4150.2; uniform 4-bit B=1 250.2 -> 250.5, B=4 464.6 -> 464.5, B=16
# 1397.8 -> 1392.4, B=32 2493.9 -> 2490.4, B=64 4158.0 -> 4141.6. The layer
# alone (B=16, moe_gate_up_interleave_h100_s51.json): whole-expert mix
# 324.0 -> 315.5 us, the benchmark's in-expert mix 314.5 -> 317.4, uniform
# 4-bit 308.4 -> 309.7. So up to 32 tokens, where the mixed gain is 1-3 %
# and the uniform loss at most 0.4 %; not at 64, where both lose.
# Choosing the order in the launch from the store's widths (so that
# uniform layers keep expert major under a captured graph) was built and not
# kept: the slot derived from a loaded value took the 16-token tile's loops
# from 229-382 to 285-437 instructions a step (local sm_90 SASS,
# benchmarks/NOTES.md session 51).
# With session 51's PDL defaults too, against session 50's defaults (H100,
# two interleaved rounds, e2e_defaults_ab_h100_s51.json): mixed 2/6 B=4
# 452.7 -> 463.9, B=16 1342.5 -> 1371.1; uniform 4-bit B=4 464.3 -> 463.4,
# B=16 1393.2 -> 1386.9.
GATE_UP_INTERLEAVE_MAX_TOKENS = 32
# Where a wide tile is compiled in (Mixtral B = 33-64), gate/up as two
# launches on two streams, each compiled for one token tile, the base tile's
# at 4 stages (MoeTiles.gate_up_split_stages). H100, random routing, the
# layer, 4-bit, us, shipped -> split: B=48 369.7 -> 352.4, B=56 409.1 ->
# 398.9, B=64 413.0 -> 402.2 (2-bit 333.1 -> 326.1, 8-bit 590.7 -> 582.0);
# end to end, two rounds, tok/s: 4-bit B=48 3378.1 -> 3539.9, B=56 3723.9 ->
# 3835.8, B=64 4233.8 -> 4326.4; mixed 2/6 3364.7 -> 3502.4, 3710.0 -> 3809.6,
# 4227.7 -> 4308.6 (benchmarks/results/*_split_*_h100_s55.json). One launch
# after the other instead: B=64 4-bit layer 418.6 -> 433.1 us, end to end
# 4165.5 -> 4089.5 (each launch's tail idles the GPU); B=48 378.9 -> 354.3.
WIDE_GATE_UP_SPLIT_STAGES = 4
# The gate/up launch apart from its combine (MoeTiles.gate_up_apart): a
# program per token tile storing partial sums (168 registers at the 8-token
# tile, 3 programs a multiprocessor, against 238 and 2), then a combine
# launch. H100, Mixtral, round-robin routing, 4-bit, shipped -> apart: gate/up
# alone at B=16 199.5 -> 191.2 us (the combine launch alone 8.0 us); the
# layer, two rounds, B=16 299.0 / 299.5 -> 292.0 / 292.1 us, B=64 352.5 /
# 354.1 -> 341.6 / 342.1, but B=1 (the one-token tile, never apart) 86.1 ->
# 96.5 / 96.7; end to end, two rounds, tok/s: 4-bit B=4 479.1 -> 498.1,
# B=16 1435.1 -> 1462.5, B=32 2572.8 -> 2705.6, B=64 4427.8 -> 4657.7; mixed
# 2/6 B=16 1427.1 -> 1456.3, B=64 4433.8 -> 4640.5
# (benchmarks/results/s61_*_h100.json). Not measured past 64 tokens, where
# the grid's programs past an expert's tiles (exiting at once) grow with the
# token count.
GATE_UP_APART_MAX_TOKENS = 64
# gate_up_sums_fp16: the apart gate/up launch stores its sums in fp16
# (clamped to its range) instead of fp32, halving what it writes and the
# combine launch reads (Mixtral B=64: 14.7 -> 7.3 MB a layer each way).
# H100, Mixtral, round-robin routing, the layer, two rounds, us, fp32 ->
# fp16: 4-bit B=16 289.9 / 290.5 -> 288.4 / 288.8, B=32 316.2 / 318.7 ->
# 315.4 / 316.4, B=64 340.2 / 342.3 -> 338.1 / 338.4, 2-bit B=64 253.8 /
# 254.1 -> 250.5 / 250.8, 8-bit B=64 553.2 / 553.0 -> 545.2 / 545.4; end to
# end, one round, tok/s: 4-bit B=32 2703.0 -> 2723.0, B=64 4694.3 -> 4767.6;
# mixed 2/6 2671.3 -> 2699.3, 4677.7 -> 4742.5
# (benchmarks/results/s66_sums_fp16_h100.json).
GATE_UP_SUMS_FP16 = True
# combine_one_plane: the combine launch stores, of h's three planes, only
# the one the expert's down view reads (a third of its h stores; Mixtral
# B=64: 3.7 of 11 MB a layer). H100, Mixtral, round-robin routing, the
# layer, two rounds, us, all planes -> one plane: 4-bit B=16 280.4 / 280.6
# -> 279.5 / 279.6, B=32 307.1 / 308.5 -> 303.1 / 304.0, B=64 329.2 / 330.3
# -> 323.0 / 322.8, 2-bit B=64 248.1 / 248.2 -> 240.4 / 240.7, 8-bit B=64
# 530.5 / 530.3 -> 521.6 / 521.6; end to end, one round, tok/s: 4-bit B=32
# 2781.2 -> 2815.2, B=64 4853.5 -> 4928.0; mixed 2/6 2756.7 -> 2786.5,
# 4832.9 -> 4890.3 (benchmarks/results/s68_one_plane_h100.json).
COMBINE_ONE_PLANE = True
# base_tile_gate_up_maxnreg: register cap of the apart gate/up launch
# compiled for the 16-token tile alone (B = 32, and the base-tile launch of
# B = 48-64's token-class split). Uncapped it takes 214 registers (2 programs
# of 4 warps a multiprocessor); at 168 (3 programs, 3 x 67 KB of shared
# memory) local sm_90 SASS (Triton 3.6) puts 96 B of stack outside the loops
# and none in them, the loops as long (4-bit step 370 against 373). The
# 32-token tile spills inside its loops under 168 (LDL 1-10), so it keeps
# its registers. H100, Mixtral, round-robin routing, the layer, two rounds,
# us, uncapped -> 168: 2-bit B=32 229.4 / 229.7 -> 217.1 / 218.2, B=64
# 252.5 / 252.5 -> 241.9 / 242.5, but 4-bit B=32 308.8 / 311.0 -> 313.6 /
# 314.4, B=64 333.2 / 334.8 -> 339.2 / 339.8, 8-bit B=64 538.5 / 538.6 ->
# 553.4 / 553.6; end to end, one round, tok/s: 4-bit B=32 2765.4 -> 2732.2,
# B=64 4752.8 -> 4708.5, mixed 2/6 2725.4 -> 2704.3, 4707.0 -> 4699.8
# (benchmarks/results/s62_cap_h100.json). A third program pays only where
# the steps are short (2 bits); one launch serves every view, so off.
BASE_TILE_GATE_UP_MAXNREG = None
# The same split of the down launch (MoeTiles.down_split_stages) does not pay.
# H100, random routing, the layer, us at 4-bit B = 48 / 56 / 64, 2-bit and
# 8-bit B=64, one launch -> split with the base tile at 4 stages -> at 3:
# 351.9-353.6 / 399.2-400.4 / 403.6-404.0 / 327.9-328.1 / 582.3-582.4 ->
# 355.3 / 458.3 / 461.5 / 364.9 / 641.9 -> 357.0 / 396.8 / 400.3 / 325.8 /
# 578.4; end to end, two rounds, 4-bit B = 48 / 56 / 64: 3528.3 / 3818.9 /
# 4322.5 -> 3352.9 / 3464.7 / 3886.4 tok/s at 4 stages
# (benchmarks/results/*_down_split_*_h100_s56.json).
WIDE_DOWN_SPLIT_STAGES = 0
# tensor_core_rows: weight rows per program of the tensor-core tiles (8, 16
# and 32 tokens), on rows / 32 warps, where the shapes divide (Mixtral; not
# Qwen1.5-MoE's ffn 1408) and the gate/up launch still fills the GPU. At 256
# (8 warps, one program per multiprocessor) each activation tile, 4 KiB a
# step at 16 tokens and read from the L2, serves twice the weight rows
# (kernels/moe_tiles.MoeTiles). Local sm_90 SASS (Triton 3.6), gate/up, 16
# tokens, 4 stages, instructions a step at 2 / 3 / 4 / 6 / 8 bits: 128 rows
# 229 / 286 / 373 / 272 / 382, 216 bytes of stack, 67 KB of shared memory;
# 256 rows 222 / 281 / 370 / 262 / 379, 128 bytes, 118 KB. Measured slower
# (H100, Mixtral, random routing, us, 128 rows -> 256): B=16 4-bit 302.9 ->
# 319.7, 2-bit 215.7 -> 230.1; B=32 4-bit 335.5 -> 364.6, 2-bit 259.4 ->
# 283.3; B=64 4-bit 401.8 -> 431.9, 2-bit 326.6 -> 358.2, 8-bit 582.3 ->
# 594.6, mixed 404.2 -> 474.3 (moe_rows_random_h100_s56.json). Under ncu
# (B=64, 2-bit, no wide tile; moe_ncu_rows_h100_s56.json) the gate/up
# launch read 392 MB from the L2 instead of 521 MB (266 MB from DRAM), but
# took 217.2 us against 191.7: barrier stalls per issued instruction 0.90
# -> 1.51, as the 8 warps of the one resident program wait for each other
# at every step, where two programs of 4 cover each other's waits; the L2
# was at 57 % of its peak with 128 rows, so its traffic was not the limit.
TENSOR_CORE_ROWS = 128
TENSOR_CORE_ROWS_CHOICES = (128, 256)
# The hardware's limit on a thread's registers (sm_70 and later).
MAX_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True)
class MoeTuning:
    """Pipeline depths and register cap that choose_tiles gives each token
    tile kind (the module constants, and moe_tuning_one_token's, hold the
    measurements).

    one_token_stages: the CUDA-core one-token tile (B=1).
    tensor_core_stages: the 16-token tile in a launch without a wide tile.
    wide_launch_stages: the base tile in a launch with the wide tile
    compiled in, and base tiles over 16 tokens.
    wide_tile_stages: the wide tile's own loops (MoeTiles.wide_stages).
    one_token_maxnreg: register cap of the one-token launches; None leaves it
    to the compiler (236 registers, 2 programs per multiprocessor). Caps
    measured slower (Mixtral B=1, 4-bit layer, moe_tune_*_b1_s23_h200.json):
    none 69.5-70.1 us, 240 69.8, 200 70.0, 168 89.7 (3 programs), 128 82.7 (4
    programs); end to end 297.5 -> 249.4 / 258.0 tok/s at 168 / 128.
    one_token_rows_per_thread: weight rows each thread of the one-token tile
    multiplies (the warps follow: 128 rows on 4 warps at 1, on 2 at 2); at 2
    each activation word read from shared memory serves two rows.
    one_token_one_launch: the one-token tile's gate/up and down projections
    in one launch (MoeTiles.one_launch).
    cuda_core_max_tokens: batches of at most this many tokens take the
    one-token tile (CUDA cores; >= 1).
    narrow_tile_max_mean: largest mean tokens per active expert for which
    choose_tiles takes the 8-token tensor-core tile (0: never).
    narrow_tile_stages: pipeline depth of the 8-token tile.
    narrow_tile_maxnreg: register cap of the 8-token tile's launches (None:
    the compiler's choice); MoeTiles.resident_programs follows it.
    base_tile_gate_up_maxnreg: register cap of the apart gate/up launches
    compiled for the 16-token tile alone (MoeTiles.gate_up_maxnreg; None:
    the compiler's choice).
    one_token_split_up: the most K ranges of each one-token gate/up row
    tile (MoeTiles.split_up; fewer where one wave of resident programs
    holds fewer; 1: never split).
    one_token_down_programs: programs per multiprocessor that the one-token
    down launch's K split and carveout count (MoeTiles.down_by_registers;
    0: resident_programs).
    down_group_cost: relative cost of a weight group at each view (1..5
    fields) by which the balanced down launch shares its work
    (MoeTiles.down_group_cost); a list is taken as a tuple.
    down_zigzag: that sharing lays the experts end to end costliest,
    cheapest, second costliest, ... (MoeTiles.down_zigzag). Off: on the
    H100 (Mixtral mixed 2/6, B=16) the layer took 312.6 us against
    313.7-314.2 without, and 306.6 against 307.3 on another machine, where
    the down launch alone took 105.3 us against 100.6
    (moe_down_sharing_h100_s49.json, moe_zigzag_b16_h100_s49.json,
    moe_views_b16_h100_s49.json): within the noise in the layer, slower alone.
    gate_up_interleave_max_tokens: launches of at most this many tokens
    number the gate/up programs row tile major (every active expert's
    program of row tile 0, then of row tile 1, ...) instead of expert major
    (MoeTiles.gate_up_interleave), so that in a state that gives whole
    experts one width the resident programs mix widths all through the
    launch; 0: never (GATE_UP_INTERLEAVE_MAX_TOKENS has the measurements).
    wide_gate_up_split_stages: where choose_tiles compiles a wide tile in,
    the gate/up projection as two launches, one per token tile, the base
    tile's at this pipeline depth, on two streams at once
    (MoeTiles.gate_up_split_stages; 0: one launch with both tiles;
    WIDE_GATE_UP_SPLIT_STAGES has the measurements).
    wide_down_split_stages: the same for the down launch
    (MoeTiles.down_split_stages; 0: one launch). Off: measured slower or
    level (WIDE_DOWN_SPLIT_STAGES).
    tensor_core_rows: weight rows per program of the tensor-core tiles
    (TENSOR_CORE_ROWS_CHOICES; 4 warps per 128 rows) where the shapes divide
    and the gate/up launch fills the GPU, else 128. Off at 128: 256 measured
    slower (TENSOR_CORE_ROWS).
    gate_up_apart_max_tokens: launches of at most this many tokens on a
    tensor-core tile run the gate/up launch without its combine or
    token-tile loop, a combine launch after it (MoeTiles.gate_up_apart;
    needs each token's top-k ids distinct); 0: never
    (GATE_UP_APART_MAX_TOKENS has the measurements).
    gate_up_sums_fp16: those launches' partial sums in fp16, not fp32
    (MoeTiles.gate_up_sums_fp16; GATE_UP_SUMS_FP16 has the measurements).
    combine_one_plane: their combine launch stores only the h plane of each
    expert's down view (MoeTiles.combine_one_plane; COMBINE_ONE_PLANE).
    """

    one_token_stages: int = ONE_TOKEN_STAGES
    tensor_core_stages: int = TENSOR_CORE_STAGES
    wide_launch_stages: int = WIDE_LAUNCH_STAGES
    wide_tile_stages: int = WIDE_TILE_STAGES
    one_token_maxnreg: int | None = None
    one_token_rows_per_thread: int = ONE_TOKEN_ROWS_PER_THREAD
    one_token_one_launch: bool = ONE_TOKEN_ONE_LAUNCH
    cuda_core_max_tokens: int = CUDA_CORE_MAX_TOKENS
    narrow_tile_max_mean: float = NARROW_TILE_MAX_MEAN
    narrow_tile_stages: int = NARROW_TILE_STAGES
    narrow_tile_maxnreg: int | None = NARROW_TILE_MAXNREG
    base_tile_gate_up_maxnreg: int | None = BASE_TILE_GATE_UP_MAXNREG
    one_token_split_up: int = ONE_TOKEN_SPLIT_UP
    one_token_down_programs: int = ONE_TOKEN_DOWN_PROGRAMS
    down_group_cost: tuple[int, ...] = DOWN_GROUP_COST
    down_zigzag: bool = False
    gate_up_interleave_max_tokens: int = GATE_UP_INTERLEAVE_MAX_TOKENS
    wide_gate_up_split_stages: int = WIDE_GATE_UP_SPLIT_STAGES
    wide_down_split_stages: int = WIDE_DOWN_SPLIT_STAGES
    tensor_core_rows: int = TENSOR_CORE_ROWS
    gate_up_apart_max_tokens: int = GATE_UP_APART_MAX_TOKENS
    gate_up_sums_fp16: bool = GATE_UP_SUMS_FP16
    combine_one_plane: bool = COMBINE_ONE_PLANE

    def __post_init__(self) -> None:
        object.__setattr__(self, "down_group_cost", check_down_group_cost(self.down_group_cost))
        check_down_zigzag(self.down_zigzag)
        for name in ("gate_up_sums_fp16", "combine_one_plane"):
            check_bool(name, getattr(self, name))
        for name, least in (("gate_up_interleave_max_tokens", 0), ("gate_up_apart_max_tokens", 0),
                            ("cuda_core_max_tokens", 1), ("one_token_down_programs", 0)):
            limit = getattr(self, name)
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < least:
                raise ValueError(f"{name} must be an int >= {least}, got {limit!r}")
        if self.one_token_rows_per_thread not in ROWS_PER_THREAD_CHOICES:
            raise ValueError(f"one_token_rows_per_thread must be one of {ROWS_PER_THREAD_CHOICES}, "
                             f"got {self.one_token_rows_per_thread}")
        for name in ("one_token_stages", "tensor_core_stages", "wide_launch_stages", "wide_tile_stages",
                     "narrow_tile_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("wide_gate_up_split_stages", "wide_down_split_stages"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tensor_core_rows not in TENSOR_CORE_ROWS_CHOICES:
            raise ValueError(f"tensor_core_rows must be one of {TENSOR_CORE_ROWS_CHOICES}, "
                             f"got {self.tensor_core_rows}")
        if self.one_token_split_up < 1:
            raise ValueError(f"one_token_split_up must be >= 1, got {self.one_token_split_up}")
        if self.narrow_tile_max_mean < 0:
            raise ValueError(f"narrow_tile_max_mean must be >= 0, got {self.narrow_tile_max_mean}")
        for name in ("one_token_maxnreg", "narrow_tile_maxnreg", "base_tile_gate_up_maxnreg"):
            cap = getattr(self, name)
            if cap is not None and not 0 < cap <= MAX_REGISTERS_PER_THREAD:
                raise ValueError(f"{name} must be None or in 1..{MAX_REGISTERS_PER_THREAD}, got {cap}")


def check_down_group_cost(costs) -> tuple[int, ...]:
    """``costs`` as a tuple of DOWN_COST_VIEWS integers in 1..DOWN_COST_MAX, or ValueError."""
    costs = tuple(costs)
    if len(costs) != DOWN_COST_VIEWS or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 < c <= DOWN_COST_MAX for c in costs):
        raise ValueError(f"down_group_cost must be {DOWN_COST_VIEWS} integers in 1..{DOWN_COST_MAX} "
                         f"(views 2 / 3 / 4 / 6 / 8 bits), got {costs!r}")
    return costs


def check_down_zigzag(zigzag) -> bool:
    """``zigzag`` if a bool, else ValueError."""
    return check_bool("down_zigzag", zigzag)


def check_bool(name: str, value) -> bool:
    """``value`` if a bool, else ValueError naming the field ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value
