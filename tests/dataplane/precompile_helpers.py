"""A stand-in for JITFunction.preload (tests/dataplane/test_dp_kernel_manifest.py):
it records each variant as a file in the folder its specialization names,
with the id of the process and the name of the thread that ran it, and fails
on "bad"."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


def record_preload(module: str, qualname: str, specialization: str) -> str | None:
    spec = json.loads(specialization)
    if spec.get("bad"):
        return f"{module}.{qualname}: refused"
    Path(spec["folder"], f"{qualname}-{spec['n']}-{os.getpid()}-{threading.current_thread().name}").touch()
    return None
