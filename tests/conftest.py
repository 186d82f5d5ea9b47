"""Suite-wide set-up that must happen before any test module is imported.

Without CUDA, Triton kernels run in Triton's interpreter. TRITON_INTERPRET is
read when triton is first imported, and other test folders import triton
(through torch and the dataplane) before tests/kernels is collected, so it is
set here, at the root, first. It also checks that `kernels` is this project's
package and not another distribution's of the same name.

Each test function runs behind one large frame (pytest_pyfunc_call below), a
workaround for CPython 3.11-3.12's frame stack: see _on_roomy_stack.

The dataplane's start-up warm-up (dataplane/warmup.py, on by default on
CUDA) is turned off for the suite through its environment variable, which
dataplanes started in process and as subprocesses both read: on a fresh GPU
machine it compiles every tile class first (minutes), which tests of other
behaviour should not pay. tests/dataplane/test_dp_warmup.py turns it on
explicitly (a constructor argument wins over the environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PW_DATAPLANE_WARM_UP", "false")

import kernels  # noqa: E402  (after TRITON_INTERPRET; the package imports nothing)

_PROJECT_KERNELS = Path(__file__).resolve().parents[1] / "kernels"
if Path(kernels.__file__).resolve().parent != _PROJECT_KERNELS:
    # Otherwise every kernel import fails at collection with a bare
    # "No module named 'kernels.<file>'", which hides the cause.
    raise ImportError(
        f"`import kernels` found {kernels.__file__}, not {_PROJECT_KERNELS}: another "
        "distribution with a top-level package named `kernels` (Hugging Face's, which "
        "transformers>=5.25 requires) is installed ahead of this project's"
    )


# CPython 3.11-3.12 keep a thread's frames in chunks of 16 KiB and free a chunk
# as soon as the first frame in it returns (gh-142183; 3.13.x and 3.14 keep one
# spare chunk since March 2026). Code that calls many small functions right at
# a chunk's end maps and unmaps a chunk on every call: Triton's interpreter did
# so 275,000 times in one one-token kernel test, which took 22.7 s, 8.1 of them
# system time. Behind a frame too large for a 16 KiB chunk the test starts a
# fresh chunk, and its own frames fill the room behind that frame, which no
# chunk boundary crosses while the test runs (the same test: 12.2 s).
# 3,100 locals are 24.8 KB of frame; with the 8,000 bytes CPython adds to a new
# chunk's request (MINIMUM_OVERHEAD) the chunk is 64 KiB, ~39 KiB of it room.
ROOMY_FRAME_LOCALS = 3100


def _frame_of_locals(count: int):
    """A function call(fn, kwargs) -> fn(**kwargs) whose frame holds `count`
    local variables (assigned only in a branch never taken: their slots are
    what it is for)."""
    names = " = ".join(f"v{i}" for i in range(count))
    source = f"def call(fn, kwargs):\n    if fn is None:\n        {names} = None\n    return fn(**kwargs)\n"
    namespace: dict = {}
    exec(compile(source, "<roomy frame>", "exec"), namespace)
    return namespace["call"]


_on_roomy_stack = _frame_of_locals(ROOMY_FRAME_LOCALS)


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """Runs the test function through _on_roomy_stack (above)."""
    test = pyfuncitem.obj
    pyfuncitem.obj = lambda **kwargs: _on_roomy_stack(test, kwargs)
    try:
        yield
    finally:
        pyfuncitem.obj = test
