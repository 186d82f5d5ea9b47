"""Variant for A/B runs, run in a copy's root: the combine launch as before session 66, storing all
three h planes for every expert (kernels/moe_combine._combine_token_tile with ONE_PLANE False)
instead of only the plane of the expert's down view."""
from pathlib import Path

ONE = "              BN, BM, USE_ASM, nf_down, True)\n"
path = Path("kernels/moe_combine.py")
text = path.read_text()
assert text.count(ONE) == 1
path.write_text(text.replace(ONE, ONE.replace("True", "False")))
