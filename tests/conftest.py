"""Suite-wide set-up that must happen before any test module is imported.

Without CUDA, Triton kernels run in Triton's interpreter. TRITON_INTERPRET is
read when triton is first imported, and other test folders import triton
(through torch and the dataplane) before tests/kernels is collected, so it is
set here, at the root, first.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
