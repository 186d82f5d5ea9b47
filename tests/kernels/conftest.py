"""Kernel tests run on the GPU when there is one, else through Triton's CPU
interpreter (TRITON_INTERPRET is set by tests/conftest.py, before anything
imports triton)."""

import pytest
import torch


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
