"""One running three-process stack per test module (see e2e_stack.py)."""

from __future__ import annotations

import pytest
from e2e_stack import print_logs, start_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    running = start_stack(root)
    yield running
    running.stop()
    print_logs(root)
