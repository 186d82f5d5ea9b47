"""Variant for A/B runs (tools/device/s59_ab.sh), run in a copy's root: the shared-memory carveout of
every MoE weight launch sized for the programs its compiled register count allows (kernel.n_regs), as
session 61's gate_up_apart launch already has it (settle_carveout(by_registers=True)), not for
MoeTiles.resident_programs' assumption of 2 when no cap is set. Why: the one-token launches compile to
168 (gate/up, 8 B of stack) and 160 (down) registers at 4 warps (local Triton 3.6 sm_90 SASS,
sass_loops.py --block-m 1 --interleave / --balance), room for 3 programs, but the carveout sized for 2
(2 x 53 KB) leaves no shared memory for a third. The price: less L1."""
from pathlib import Path

path = Path("kernels/moe_workspace.py")
text = path.read_text()
old = "        if by_registers:\n"
assert text.count(old) == 1
path.write_text(text.replace(old, "        if True:  # every launch (the variant)\n"))
