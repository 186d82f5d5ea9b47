"""Variant for A/B runs (tools/device/s59_ab.sh), run in a copy's root: the shared-memory carveout of
each MoE weight launch sized for the programs its compiled register count allows (kernel.n_regs), not
for MoeTiles.resident_programs' assumption of 2 when no cap is set. Why: with the opaque rows (session
60) the one-token launches compile to 168 (gate/up, 8 B of stack) and 160 (down) registers at 4 warps
(local Triton 3.6 sm_90 SASS, sass_loops.py --block-m 1 --interleave / --balance), room for 3 programs,
but the carveout sized for 2 (2 x 53 KB) leaves no shared memory for a third. The price: less L1."""
from pathlib import Path

path = Path("kernels/moe_workspace.py")
text = path.read_text()
old = "        limit_carveout_once(kernel, ws.carveouts_set, tiles.resident_programs, ws.h.device)\n"
new = ("        programs = max(tiles.resident_programs, resident_programs(kernel.n_regs, tiles.num_warps))\n"
       "        limit_carveout_once(kernel, ws.carveouts_set, programs, ws.h.device)\n")
imp = "from kernels.moe_tiles import MoeTiles, choose_tiles\n"
assert text.count(old) == 1 and text.count(imp) == 1
imp_new = "from kernels.moe_tiles import MoeTiles, choose_tiles, resident_programs\n"
path.write_text(text.replace(old, new).replace(imp, imp_new))
