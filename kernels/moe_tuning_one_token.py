"""The one-token tile's tuning values (MoeTuning's one_token_* fields and
cuda_core_max_tokens): what was measured for each, with the shipped value.
kernels/moe_tuning.py holds the other tiles' values and MoeTuning itself.

Imports no Triton, so that configs can hold one.
"""

# The shipped values and why (H200 unless named, Triton 3.6; benchmarks/results/):
#
# one_token_stages: the one-token tile's K loop (its loads go through
# stages - 1 shared-memory buffers, stages - 2 groups in flight while one is
# multiplied). Mixtral B=1, us per layer at 2 / 4 / 8 bits / mixed 2-6, 3 -> 4
# stages: 66.8 / 80.2 / 113.6 / 86.7 -> 65.6 / 78.4 / 113.8 / 84.6; 5, 6, 7
# stages slower again (8-bit 119.1 / 123.5 / 128.6); Qwen1.5-MoE 4-bit 22.8 ->
# 21.0 (moe_tune_stages_b1_s21_h200.json). End to end 4-bit B=1 +1.2 %
# (e2e_h200_s21_stages*.json).
ONE_TOKEN_STAGES = 4
# one_token_rows_per_thread: 1 (one row per thread since session 13). At 2
# (local Triton 3.6 sm_90 SASS, 128 rows on 2 warps) the gate/up loop takes
# 432 instructions a step for two rows against 248 for one at 4 bits (LDS
# 28 against 24 a step), 255 registers with 256 bytes of stack outside the
# loops: 4 programs per multiprocessor instead of 2. Measured slower
# (Mixtral B=1, end to end, 65de161: 4-bit 297.6 -> 271.2 tok/s, 8-bit
# 218.5 -> 188.3, 2-bit 349.8 -> 330.7; at 3 stages 281.1 / 195.8;
# e2e_h200_s26_{warm_none,rpt2,rpt2_st3}.json). Under ncu
# (moe_ncu_b1_rpt2_s26_h200.json) its launches execute 15 % fewer
# instructions and 28 % fewer shared-memory wavefronts, but spill (gate/up
# 10.3 MB, down 15.3 MB of local stores a layer) and wait longer on memory
# (long scoreboard 0.91 -> 1.69 cycles per issue at gate/up); the down
# launch took 29.9 us against 24.7.
ONE_TOKEN_ROWS_PER_THREAD = 1
ROWS_PER_THREAD_CHOICES = (1, 2)  # the values compiled and tested
# one_token_one_launch: the one-token gate/up and down projections in one
# launch (kernels/moe_gate_up_down.py). Measured slower, so off: Mixtral B=1
# end to end, 4 bits, interleaved in one call each (tok/s, two runs): off
# 299.6 / 299.6 against 290.1 / 290.4 with every program counting itself
# done (8 bits 220.6 against 212.7; e2e_h200_s28_c1_*.json); off 299.2 /
# 299.4 against 294.8 / 294.5 with the down programs alone counting
# (e2e_h200_s28_c2_*.json); off 299.4 / 299.9 against 296.9 / 297.2 with no
# ticket either (program-id order, a probe: not deadlock-free in principle;
# e2e_h200_s28_c3_*.json). The one launch's share of the step's critical
# path was 64.3 us a layer, against 41.8 + 20.7 for the two launches in
# session 27's profile.
ONE_TOKEN_ONE_LAUNCH = False
# cuda_core_max_tokens: batches of at most this many tokens take the one-token
# CUDA-core tile (an expert's tokens one pass over its rows each), larger ones
# the tensor-core tiles. At B=1 those were 2-35 % slower (H100, Mixtral and
# Qwen1.5-MoE layers, benchmarks/results/s63_b1_tiles_h100.json). At B=4
# (s63_small_h100.json) the CUDA-core tile took Qwen1.5-MoE's 4-bit layer from
# 43.5 to 40.6 us where every expert held one token (round robin) and to 49.5
# (from 40.5) under random routing, where some hold two; Mixtral level to 2.8 %
# slower. B = 2-3 (s64_call_h100.json, s64_followups_h100.json): Mixtral
# -3.6 % at 2 tokens, 4 bits, round robin, but +45-109 % where the tokens share
# experts (random); Qwen on 64 rows -7 to -9 % at 2-4 bits (8-bit -3 %) where no
# expert holds two tokens and +23 % where two do (B=4), which at B=3 is 60 %
# of uniform draws.
CUDA_CORE_MAX_TOKENS = 1
# one_token_split_up: the most K ranges of each one-token gate/up row tile
# (MoeTiles.split_up); choose_tiles takes fewer where one wave of resident
# programs holds fewer, or a range would hold fewer than
# moe_tiles.MIN_GROUPS_PER_RANGE groups. Qwen1.5-MoE at B=1 has 176 gate/up programs of 64
# rows (2 warps) for 132 multiprocessors. H100, us per layer at 8 / 4 / 2
# bits / mixed 2-6 (benchmarks/results/moe_split_up_b1_h100_s46.json; "4
# resident" = programs of 2 warps counted as 4 per multiprocessor, which
# also takes the down split from 2 to 4): 1 range 26.8 / 20.5 / 17.4 / 22.4;
# 4 resident 26.8 / 20.4 / 17.4 / 21.8; with 2 ranges 26.1 / 19.6 / 16.1 /
# 20.5; 3: 26.4 / 19.9 / 16.0 / 20.6; 4 (over one wave) 29.5 / 22.5 / 18.7 /
# 22.6. Mixtral-8x7B (448 programs over 264 slots: never split by the fill
# rule) is slower split: 4-bit 82.8 -> 88.2 / 90.3 us at 2 / 3 ranges.
ONE_TOKEN_SPLIT_UP = 2
# one_token_down_programs: programs per multiprocessor that the one-token down
# launch's K split and carveout count (0: resident_programs). It compiles to
# 158 registers (Triton 3.6), room for 3 of 4 warps: Mixtral B=1 split 6 (384
# programs, 396 places) against 4. Level on the H100: layer 4 / 2 / 8 bits /
# mixed 86.0 / 57.5 / 144.5 / 90.8 us against 85.9 / 58.3 / 143.9 / 90.5, end
# to end 4-bit 246.2 against 246.1 tok/s (s64_call_h100.json); Qwen1.5-MoE at
# 6 level but 8-bit (27.3 against 28.1 us). Off.
ONE_TOKEN_DOWN_PROGRAMS = 0
