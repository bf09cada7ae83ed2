"""mamba2_aot: prebuilt Mamba-2 kernels, loaded through the CUDA driver with ctypes (no JIT, no toolchain).

    from mamba2_aot import runtime
    runtime.launch("ssd_chunk_cumsum", dt=dt, A=A, dt_out=dt_out, dA_cumsum=dA_cumsum, chunk_size=256)

Importing needs only the standard library; the CUDA driver is opened on the first launch. See
docs/RUNTIME.md for the API, tensor and stream rules, environment variables and errors.
"""
__version__ = "0.1.0"

from .errors import (AlignmentError, AliasingError, ArchMismatchError, ArrayProtocolError, CubinNotInstalledError,
                     CubinPackageError, CudaDriverError, DeviceError, DriverNotFoundError, DriverTooOldError,
                     DTypeError, GraphCaptureError, InvalidArgumentError, Mamba2AOTError, ManifestError,
                     Sha256MismatchError, ShapeError, StreamError, StrideError, UnvalidatedVariantError,
                     VariantNotFoundError, VersionLockError)
from .runtime import launch, list_variants, preload, workspace_size

__all__ = [
    "__version__", "launch", "preload", "workspace_size", "list_variants",
    "Mamba2AOTError", "InvalidArgumentError", "ArrayProtocolError", "DTypeError", "ShapeError", "StrideError",
    "AlignmentError", "DeviceError", "AliasingError", "StreamError", "VariantNotFoundError", "UnvalidatedVariantError",
    "CubinPackageError", "CubinNotInstalledError", "ManifestError", "VersionLockError", "Sha256MismatchError",
    "ArchMismatchError",
    "CudaDriverError", "DriverNotFoundError", "DriverTooOldError", "GraphCaptureError",
]
