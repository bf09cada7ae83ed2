"""The pinned toolchain: versions recorded in the manifest and the exact compile options.

Everything here is part of every cubin's build signature: change it and SCons rebuilds all variants.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

# Release builds: explicit target, keep the cubin, no line info (it embeds absolute source paths).
_OPTIONS = "--gpu-arch {arch} --keep-cubin"

# The short arch names the build accepts (arch=sm90,sm100) and the exact targets they compile for.
ARCH_TARGETS = {"sm80": "sm_80", "sm90": "sm_90a", "sm100": "sm_100a", "sm103": "sm_103a", "sm120": "sm_120a"}


def compile_options(arch: str) -> str:
    return _OPTIONS.format(arch=arch)


def compute_capability(arch: str) -> list[int]:
    """``sm_90a`` -> ``[9, 0]``: the devices whose compute capability these cubins load on."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return [int(digits[:-1]), int(digits[-1])]


def dsl_versions() -> dict:
    """The installed CuTe DSL version and its CUDA flavour (which ``libs-cuXY`` package is present)."""
    version = importlib.metadata.version("nvidia-cutlass-dsl")
    flavours = []
    for flavour in ("cu12", "cu13"):
        try:
            importlib.metadata.version(f"nvidia-cutlass-dsl-libs-{flavour}")
            flavours.append(flavour)
        except importlib.metadata.PackageNotFoundError:
            pass
    if len(flavours) != 1:
        raise RuntimeError(f"expected exactly one CUDA flavour of nvidia-cutlass-dsl-libs, found {flavours}")
    # The DSL assembles PTX in-process with the libnvptxcompiler its libs wheel bundles; that library does not
    # report a version, so the wheel that pins it is recorded (the PTX ISA version goes in per build).
    ptxas = f"libnvptxcompiler of nvidia-cutlass-dsl-libs-{flavours[0]} {version}"
    return {"cutlass_dsl": version, "cuda_flavour": flavours[0], "ptxas": ptxas}


def cuobjdump() -> str:
    """Path of the cuobjdump shipped by the ``nvidia-cuda-cuobjdump`` wheel."""
    import nvidia

    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob("cu*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
