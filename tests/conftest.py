"""Suite-wide set-up that must happen before any test module is imported.

Without CUDA, Triton kernels run in Triton's interpreter. TRITON_INTERPRET is
read when triton is first imported, and other test folders import triton
(through torch and the dataplane) before tests/kernels is collected, so it is
set here, at the root, first. It also checks that `kernels` is this project's
package and not another distribution's of the same name.

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
