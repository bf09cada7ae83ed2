"""The exceptions the runtime raises. Every message names what was wrong and what was expected.

    Mamba2AOTError
    ├── InvalidArgumentError (also ValueError)   a call's arguments are unusable; nothing was launched
    │   ├── ArrayProtocolError (also TypeError)  not an array: no __cuda_array_interface__ / __dlpack__
    │   ├── DTypeError                            wrong element type
    │   ├── ShapeError                            wrong rank, inconsistent or out-of-range dims
    │   ├── StrideError                           strides the kernel cannot honour (e.g. overlapping output)
    │   ├── AlignmentError                        pointer not aligned as the kernel assumes
    │   ├── DeviceError                           not on a CUDA device, or tensors / stream on different devices
    │   ├── AliasingError                         an output overlaps an input or another output
    │   └── StreamError                           the stream argument is not a stream
    ├── VariantNotFoundError (also LookupError)  unknown family, or no built variant for these constants
    │   └── UnvalidatedVariantError              only an unvalidated build has them (not used by default)
    ├── CubinPackageError                        the cubins: missing wheel, broken manifest, version lock, ...
    │   ├── CubinNotInstalledError
    │   ├── ManifestError
    │   ├── VersionLockError
    │   ├── Sha256MismatchError
    │   └── ArchMismatchError
    ├── CudaDriverError                          a driver call failed (code, name, message)
    │   ├── DriverNotFoundError                  no libcuda.so.1
    │   └── DriverTooOldError
    └── GraphCaptureError                        a cold kernel met while the stream captures a CUDA graph
"""
from __future__ import annotations


class Mamba2AOTError(Exception):
    """Base class of every error raised by mamba2_aot."""


class InvalidArgumentError(Mamba2AOTError, ValueError):
    """An argument of a call is unusable. ``argument`` is its name (``None`` when several are involved)."""

    def __init__(self, argument: str | None, message: str):
        super().__init__(message)
        self.argument = argument


class ArrayProtocolError(InvalidArgumentError, TypeError):
    """The object is not a device array this runtime can read."""


class DTypeError(InvalidArgumentError):
    """The array's element type is not one the call accepts."""


class ShapeError(InvalidArgumentError):
    """Wrong rank, inconsistent dims across arguments, or a dim outside the kernel's integer range."""


class StrideError(InvalidArgumentError):
    """Strides the kernel cannot honour (non-integral in elements, or an output whose elements overlap)."""


class AlignmentError(InvalidArgumentError):
    """A pointer is not aligned as the kernel assumes."""


class DeviceError(InvalidArgumentError):
    """An array is not in CUDA device memory, or the arrays and the stream are not on one device."""


class AliasingError(InvalidArgumentError):
    """An output's memory overlaps an input's or another output's: refused rather than corrupted."""


class StreamError(InvalidArgumentError, TypeError):
    """The ``stream`` argument is not something a CUDA stream handle can be read from."""


class VariantNotFoundError(Mamba2AOTError, LookupError):
    """An unknown family, or no built variant with the requested compile-time constants: for any installed
    arch (raised before the driver is opened), or for the device's arch."""


class UnvalidatedVariantError(VariantNotFoundError):
    """The only built variant with the requested constants is marked unvalidated in its manifest (a build
    experiment, or code that could not be validated on hardware): not used unless
    ``MAMBA2_AOT_ALLOW_UNVALIDATED=1``."""


class CubinPackageError(Mamba2AOTError):
    """Something is wrong with the installed cubins; the message says how to fix it."""


class CubinNotInstalledError(CubinPackageError):
    """No cubin package (or override directory) provides cubins for the device's architecture."""


class ManifestError(CubinPackageError):
    """A manifest is unreadable, has an unknown schema, or disagrees with the cubin or the runtime."""


class VersionLockError(CubinPackageError):
    """The cubin package's version differs from the runtime's (they are released together)."""


class Sha256MismatchError(CubinPackageError):
    """A cubin file's size or sha256 differs from its manifest entry (corrupt or altered install)."""


class ArchMismatchError(CubinPackageError):
    """The cubins were built for another GPU architecture than the device's."""


class CudaDriverError(Mamba2AOTError):
    """A CUDA driver call failed. ``code`` is the CUresult, ``name`` e.g. ``CUDA_ERROR_INVALID_VALUE``."""

    def __init__(self, code: int, name: str, message: str, call: str = ""):
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message
        self.call = call


class DriverNotFoundError(CudaDriverError):
    """``libcuda.so.1`` could not be loaded (no NVIDIA driver in this container or machine)."""

    def __init__(self, detail: str):
        super().__init__(
            -1, "DRIVER_NOT_FOUND",
            f"cannot load the CUDA driver library libcuda.so.1 ({detail}); install the NVIDIA driver, "
            "or run the container with GPU access (e.g. docker --gpus all)",
        )


class DriverTooOldError(CudaDriverError):
    """The driver lacks an entry point the runtime needs (the cuLibrary API needs CUDA 12.0+)."""

    def __init__(self, detail: str):
        super().__init__(-1, "DRIVER_TOO_OLD", f"{detail}; mamba2_aot needs an NVIDIA driver for CUDA 12.0 or newer "
                         "(R525+); upgrade the driver")


class GraphCaptureError(Mamba2AOTError):
    """A kernel not yet loaded was needed while the stream was capturing a CUDA graph."""
