"""benchmarks/sass_loops.py: the loop finder on a known snippet, and a real
sm_90 compile of the down launch (Triton's wheel carries ptxas and
cuobjdump, so no GPU is needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sass_loops import inner_loops, opcode

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
        /*0100*/                   MOV R1, c[0x0][0x28] ;
        /*0110*/                   LOP3.LUT R2, R3, 0x3, RZ, 0xc0, !PT ;
        /*0120*/                   HGMMA.64x16x16.F32 R24, R96, gdesc[UR36], RZ, !UPT ;
        /*0130*/                   PRMT R4, R5, 0x4240, R6 ;
        /*0140*/               @P0 BRA 0x110 ;
        /*0150*/                   LOP3.LUT R2, R3, 0x3, RZ, 0xc0, !PT ;
        /*0160*/               @P1 BRA 0x150 ;
        /*0170*/                   EXIT ;
"""


def test_finds_only_loops_around_tensor_core_products():
    loops = inner_loops(SNIPPET)
    assert [(lp.start, lp.instructions) for lp in loops] == [(0x110, 4)]
    assert loops[0].counts["HGMMA"] == 1 and loops[0].counts["LOP3"] == 1 and loops[0].counts["PRMT"] == 1


def test_opcode_drops_only_the_guard_predicate():
    # A character-set strip of "@!P0123456789T" once turned PRMT into RMT.
    texts = ("PRMT R4, R5, 0x4240, R6", "@P1 PRMT R4, R5", "@!P0 BRA 0x110", "@!UPT UIADD3 UR4, UR5",
             "@PT LDG.E R1, [R2]")
    assert [opcode(t) for t in texts] == ["PRMT", "PRMT", "BRA", "UIADD3", "LDG.E"]


@pytest.mark.slow
def test_down_launch_has_one_loop_per_view(tmp_path):
    # In a child process: this session runs Triton's interpreter, which cannot compile.
    out = tmp_path / "down.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_loops.py"), "down", "--out", str(out)],
                   check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    loops = json.loads(out.read_text())["loops"]
    assert len(loops) == 5  # views of 2, 3, 4, 6 and 8 bits
    assert all(lp["HGMMA"] == 16 for lp in loops)  # 128 rows x 128 K: 2 x 8 products
    # v4: the 2-, 3- and 4-bit views mask their codes in place; the 6- and
    # 8-bit views split byte lanes with PRMT
    assert sorted(lp["PRMT"] >= 64 for lp in loops) == [False, False, False, True, True]
    # the decoded tile is what each thread holds of the mma operand: no shuffles
    assert all(lp["SHFL"] == 0 for lp in loops)


@pytest.mark.slow
def test_cuda_core_tile_sums_each_row_in_its_thread(tmp_path):
    # The one-token build (choose_tiles at B=1: 128 rows, 4 warps): each
    # thread's row summed in the thread (no shuffles), no tensor cores, its
    # 128 weights per step in 64 integer dot products (dp2a: two each).
    out = tmp_path / "gate_up.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_loops.py"), "gate_up", "--block-m", "1",
                    "--out", str(out)], check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    loops = json.loads(out.read_text())["loops"]
    assert len(loops) == 5
    assert all(lp["HGMMA"] == 0 and lp["SHFL"] == 0 for lp in loops)
    assert all(lp["IDP"] == 64 for lp in loops)
