"""tests/conftest.py runs every test function behind one frame too large for
a 16 KiB chunk of CPython's frame stack (3.11-3.12's chunk thrash; see there)."""

import sys

CHUNK_POINTERS = 16384 // 8  # a 16 KiB chunk holds this many object pointers


def test_runs_behind_the_roomy_frame():
    frame, codes = sys._getframe(), []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    roomy = [code for code in codes if code.co_filename == "<roomy frame>"]
    assert len(roomy) == 1 and roomy[0].co_nlocals > CHUNK_POINTERS
    # The test is called from it directly (through the hook's lambda), so its
    # own frames start in the room behind it.
    assert codes.index(roomy[0]) <= 2
