"""Programmatic dependent launch (PDL) for the decode step's launches.

A B=1 decode step of Mixtral is ~390 launches, most of them a few
microseconds long; the step took 4.08 ms against 3.90 ms of kernel time
(benchmarks/results/e2e_h200_s16_b1_profile.json), so the gaps between
launches alone were ~0.45 us each. With PDL (Hopper and later) a launch may
begin while the launch before it in the stream still runs: its programs
become resident and wait.

Contract of a kernel that takes part: it calls `wait_for_previous_grid(PDL)`
before it writes memory and before it reads anything the previous launch in
the stream may write (the wait returns once that grid has completed and its
writes are visible). The call then lets the next launch begin. So a launch
begins only after every program of the launch before it has passed its wait,
that is, after every launch before that one has completed.

Hence the one thing a kernel may do before its wait: load what the previous
launch does not write, since everything before that launch has completed:
the step's inputs (positions, slots, block tables, context lengths, copied
before the step), the weight store's tables, or what a launch two or more
back wrote (the MoE entry's routing, read by the down launch). Such loads
go through the L2 (`cache_modifier=".cg"`: an L1 line from before is never
read) and take their round trips off the chain that starts at the wait.
The down launch's routing, the decode attention's length and page and the
rotary launch's angles before the wait, end to end on the H200 (synthetic
Mixtral-8x7B, three interleaved rounds,
benchmarks/results/e2e_h200_s30_prewait.json): 4-bit B=1 308.7-309.7 tok/s
against 302.7-303.6, B=16 1431.8 against 1411.2, 8-bit B=1 223.9 against
221.4. The MoE entry's and the rmsnorm launch's weights before the wait
came next: 4-bit B=1 307.4-308.7 -> 310.9-312.3 tok/s, 8-bit 223.9 ->
225.4, B=16 level (benchmarks/results/e2e_h200_s31_ab.json, v0 -> v1).
The gate/up launch's field counts before the wait, with the slot's expert
and range read in one record after it, lost 0.5 % at B=1 and 6 % at B=16
(the same file, v2 -> v3; reverted). An L2 prefetch of weights
before the wait gained nothing (kernels/dense_gemv.py, benchmarks/NOTES.md
session 20). A kernel after one that does not take part (cuBLAS, torch)
launches only when that kernel has completed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# griddepcontrol needs sm_90.
PDL_MIN_CAPABILITY = (9, 0)
# Launches over at most this many token rows (or sequences) take part. End to
# end on the H200 (synthetic Mixtral-8x7B, 4-bit experts, graphs; one call
# each against 34b9a82, benchmarks/results/e2e_h200_s17_pdl*.json): B=1
# 243.4 -> 254.1 tok/s, B=16 1342.6 -> 1342.9, B=64 4497.9 -> 4435.2 with
# every launch taking part; repeated at B=64 with the MoE entry launch
# (de1bbd8, e2e_h200_s18_b64_pdl{_all,16}.json): 4453.3 with every launch,
# 4523.1 with a limit of 16. Past 16 rows the MoE weight launches stay out
# (PDL_MOE_WEIGHT_MAX_ROWS) and the attention projections run on
# kernels/dense_mma.py, which takes part, instead of cuBLAS, which does not
# (DataplaneConfig.dense_mma_max_tokens): then the small launches of a wide
# batch chain. H100, two interleaved rounds each, tok/s with a limit of 16
# (projections on cuBLAS) -> 64: B=32 2493.9 -> 2529.1
# (e2e_interleave_b64_ab_h100_s51.json), B=64 4160.0 -> 4176.3, and 4172.1
# with the weight launches taking part too (e2e_pdl_b64_ab_h100_s51.json).
# With the gate/up interleave (moe_tuning.GATE_UP_INTERLEAVE_MAX_TOKENS),
# session 50's defaults -> these (e2e_defaults_ab_h100_s51.json): 4-bit B=32
# 2489.7 -> 2528.8, B=64 4158.2 -> 4183.2; mixed 2/6 B=32 2386.6 -> 2452.8,
# B=64 4147.8 -> 4162.2.
PDL_MAX_ROWS = 64
# The MoE gate/up and down launches' own limit (PdlPolicy.moe_weight_max_rows):
# their resident waiting programs would share the multiprocessors with the
# launch before, which past 16 rows is long enough to lose by it (above).
PDL_MOE_WEIGHT_MAX_ROWS = 16


@dataclass(frozen=True)
class PdlPolicy:
    """Which launches take part in PDL: those over at most max_rows token
    rows (or sequences); 0 turns PDL off (kernel-time profiles, kernels timed
    alone). moe_weight_max_rows: the MoE weight launches' own limit (gate/up
    and down, kernels/moe_mixed.py; None: max_rows; never above max_rows),
    so that the small launches of a wide batch chain while the weight
    launches, whose resident waiting programs would share the
    multiprocessors with the launch before, do not. Passed
    down from DataplaneConfig.pdl_max_rows and pdl_moe_weight_max_rows to
    every wrapper of a taking-part kernel (model.use_pdl, PagedExperts.pdl)."""

    max_rows: int = PDL_MAX_ROWS
    moe_weight_max_rows: int | None = PDL_MOE_WEIGHT_MAX_ROWS

    def __post_init__(self) -> None:
        if not isinstance(self.max_rows, int) or self.max_rows < 0:
            raise ValueError(f"PdlPolicy.max_rows must be an int >= 0, got {self.max_rows!r}")
        limit = self.moe_weight_max_rows
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"PdlPolicy.moe_weight_max_rows must be None or an int >= 0, got {limit!r}")

    def moe_weights(self) -> PdlPolicy:
        """The policy of the MoE weight launches."""
        if self.moe_weight_max_rows is None:
            return self
        return PdlPolicy(max_rows=min(self.max_rows, self.moe_weight_max_rows))


DEFAULT_PDL = PdlPolicy()


def pdl_options(device: torch.device, rows: int, policy: PdlPolicy = DEFAULT_PDL) -> dict:
    """Launch keywords of a taking-part kernel over `rows` token rows (or
    sequences): its PDL constexpr, and the launch attribute on CUDA devices
    that have PDL, for launches of at most policy.max_rows rows (the CPU
    interpreter, older GPUs and larger launches run the same kernels without
    it)."""
    if (rows <= policy.max_rows and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= PDL_MIN_CAPABILITY):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def wait_for_previous_grid(PDL: tl.constexpr):
    """Waits until the previous grid in the stream has completed (its writes
    visible), then lets the next grid launch; nothing when PDL is False."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
