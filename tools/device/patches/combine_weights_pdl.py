"""Variant for A/B runs, run in a copy's root: the combine launch of MoeTiles.gate_up_apart as in
session 61, under the weight launches' PDL policy (none past 16 rows) and with its routing loads after
its PDL wait."""
from pathlib import Path


def edit(name: str, old: str, new: str) -> None:
    path = Path(name)
    text = path.read_text()
    assert text.count(old) == 1, (name, old)
    path.write_text(text.replace(old, new))


edit("kernels/moe_mixed.py", "log2p, weights_pdl, combine_pdl=pdl)", "log2p, weights_pdl)")
edit("kernels/moe_combine.py", "    wait_for_previous_grid(PDL)\n    if slot < n_act:", "    if slot < n_act:")
edit("kernels/moe_combine.py", "    slot = tl.program_id(0)\n    tile = tl.program_id(1)\n",
     "    wait_for_previous_grid(PDL)\n    slot = tl.program_id(0)\n    tile = tl.program_id(1)\n")
