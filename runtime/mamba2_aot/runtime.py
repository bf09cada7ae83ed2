"""The public API: ``from mamba2_aot import runtime; runtime.launch("ssd_chunk_cumsum", ...)``.

* :func:`launch` (family, \\*, stream=None, \\*\\*arguments): validate, pick the variant, launch.
* :func:`preload` (families=None, devices=None): load kernels ahead of CUDA-graph capture.
* :func:`workspace_size` (family, \\*\\*arguments): bytes of caller-owned workspace (0 if none).
* :func:`list_variants` (family=None): the variants in the installed cubins.

Each family's arguments are documented in ``mamba2_aot/plans/<family>.py``.
"""
from .dispatch import launch, list_variants, preload, workspace_size

__all__ = ["launch", "preload", "workspace_size", "list_variants"]
