"""Which CUDA stream a launch goes on.

An explicit ``stream=`` may be:

* an ``int``: a raw ``CUstream`` handle (``0`` = the legacy default stream, ``1`` = ``CU_STREAM_LEGACY``,
  ``2`` = ``CU_STREAM_PER_THREAD``);
* an object implementing the CUDA stream protocol, ``__cuda_stream__() -> (version, handle)``
  (cuda.core, recent Numba, ...);
* an object with ``.cuda_stream`` (``torch.cuda.Stream``) or ``.ptr`` (``cupy.cuda.Stream``).

With ``stream=None``: if any argument is a CUDA torch tensor, torch's *current* stream on that tensor's
device (what every torch op would use); otherwise the **legacy default stream** (handle 0). The legacy
default stream is what "stream 0" means in CuPy, Numba and the CUDA runtime by default, and it
synchronises with other blocking streams, so it is the safe choice when nothing says otherwise.
Callers on per-thread default streams pass ``stream=2`` explicitly.
"""
from __future__ import annotations

import sys

from .errors import StreamError


def stream_handle(stream) -> int:
    """The ``CUstream`` handle (an int) of an explicit stream argument. Raises :class:`StreamError`."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    elif hasattr(stream, "__cuda_stream__"):
        protocol = stream.__cuda_stream__
        # The protocol is a method; an early cuda.core release exposed it as a property.
        _version, handle = protocol() if callable(protocol) else protocol
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    else:
        raise StreamError("stream", f"stream: expected an int CUstream handle or a stream object (with "
                          f"__cuda_stream__, .cuda_stream or .ptr), got {type(stream).__name__}")
    if not isinstance(handle, int) or isinstance(handle, bool) or handle < 0:
        raise StreamError("stream", f"stream: expected a non-negative integer handle, got {handle!r}")
    return handle


def default_stream(arguments) -> int:
    """The stream for ``stream=None``: torch's current stream if a CUDA torch tensor is among
    ``arguments`` (torch is only consulted when already imported), else the legacy default stream 0."""
    torch = sys.modules.get("torch")
    if torch is not None:
        for value in arguments:
            if isinstance(value, torch.Tensor) and value.is_cuda:
                return _torch_current_stream(torch, value.get_device())
    return 0


def _torch_current_stream(torch, device: int) -> int:
    # torch._C._cuda_getCurrentRawStream is what torch's own compiled kernels (Inductor, Triton) use
    # on every launch; it is ~10x cheaper than building a torch.cuda.Stream object. Fall back to the
    # public API if a torch version lacks it.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def resolve(stream, arguments) -> int:
    """The handle to launch on: :func:`stream_handle` of an explicit stream, else :func:`default_stream`."""
    return default_stream(arguments) if stream is None else stream_handle(stream)


def as_dlpack_stream(handle: int) -> int:
    """The DLPack ``__dlpack__(stream=...)`` value for a driver handle (DLPack spells legacy default 1)."""
    return 1 if handle == 0 else handle
