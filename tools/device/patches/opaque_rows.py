"""Variant for tools/device/s59_ab.sh, run in the copy's root: the gate/up and down row
indices made to depend on the token tile (an opaque zero, m0 >> 31), so that the compiler
cannot hoist the per-row page bases of every view out of the token-tile loop."""
from pathlib import Path

CALL = {"kernels/moe_gate_up.py": "    acc = block_matmul_any(bf_nf, arena_ptr, pt_blk,",
        "kernels/moe_down.py": "    acc = block_matmul_any(nf_d, arena_ptr, pt_down,"}
for name, call in CALL.items():
    path = Path(name)
    text = path.read_text()
    assert text.count(call) == 1, name
    path.write_text(text.replace(call, "    rows = rows | (m0 >> 31)\n" + call))
