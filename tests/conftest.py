"""Test layout: CPU tests run everywhere; tests marked ``gpu`` need a CUDA device and the built cubins.

GPU tests skip cleanly when no device is visible, so CI (no GPU) runs the CPU tests only.

Where the runtime comes from: by default the source tree (``runtime/``) with the cubins of the build tree
(``build/stage``, unless ``MAMBA2_AOT_CUBIN_DIR`` names another directory). With
``MAMBA2_AOT_TEST_INSTALLED=1`` the tests use the installed wheels instead.
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("MAMBA2_AOT_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "runtime"))
    if "MAMBA2_AOT_CUBIN_DIR" not in os.environ and (ROOT / "build" / "stage").is_dir():
        os.environ["MAMBA2_AOT_CUBIN_DIR"] = str(ROOT / "build" / "stage")


def _cuda_device_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the built cubins (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if _cuda_device_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA device visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
