"""Test layout: CPU tests run everywhere; tests marked ``gpu`` need a CUDA device and the built cubins.

GPU tests skip cleanly when no device is visible, so CI (no GPU) runs the CPU tests only.
"""
import pytest


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
