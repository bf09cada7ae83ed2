"""ctypes over the CUDA driver (``libcuda.so.1``): the only module that talks to the GPU.

Rules this layer keeps (BRIEF §4, docs/ARCHITECTURE.md):

* Every entry point gets explicit ``argtypes``/``restype``: without them ctypes passes and returns C
  ``int`` and truncates 64-bit handles. Entry points are looked up by their plain exported names; none
  of the calls used here has a ``_v2`` ABI revision except ``cuEventDestroy_v2``, and the plain (not
  ``_ptsz``) names give stream handle 0 its legacy-default-stream meaning.
* Primary contexts only: a context is never created. :meth:`CudaDriver.bind_primary_context` makes the
  device's primary context current on threads that have none (autograd workers, server threads), the
  way frameworks (torch, CuPy, JAX) share one context per device.
* Nothing is ever unloaded or released: libraries live for the process, so interpreter shutdown never
  races a ``__del__`` against driver teardown.

The driver library is opened lazily by :func:`get` on first real use, so importing the runtime, and
every call refused by validation, works on machines without a GPU or driver.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

from .errors import CudaDriverError, DriverNotFoundError, DriverTooOldError

# CUresult codes the runtime reacts to.
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_BINARY_FOR_GPU = 209

# Enum values from cuda.h (stable across CUDA 12 and 13).
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_STREAM_CAPTURE_STATUS_NONE = 0
CU_EVENT_DISABLE_TIMING = 2

# Stream handles with a fixed meaning (cuda.h): 0 = NULL stream (legacy default with the plain entry
# points), CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are valid handles anywhere a CUstream is taken.
CU_STREAM_LEGACY = 0x1
CU_STREAM_PER_THREAD = 0x2
SPECIAL_STREAMS = frozenset((0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD))

MIN_DRIVER_VERSION = 12000  # cuLibrary* / cuKernel* entry points


class CUlaunchAttributeValue(ctypes.Union):
    # The C union is 64 bytes and 8-byte aligned (it holds pointers); only clusterDim is used here.
    _fields_ = [("_bytes", ctypes.c_char * 64), ("_align", c_uint64), ("clusterDim", c_uint * 3)]


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", c_int), ("_pad", ctypes.c_char * 4), ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
        ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
        ("sharedMemBytes", c_uint),
        ("hStream", c_void_p),
        ("attrs", POINTER(CUlaunchAttribute)),
        ("numAttrs", c_uint),
    ]


assert ctypes.sizeof(CUlaunchAttribute) == 72 and ctypes.sizeof(CUlaunchConfig) == 56


def launch_attributes(cluster: tuple[int, int, int]):
    """The ``CUlaunchAttribute`` array for a variant: a cluster dimension only when cluster != (1,1,1).

    Returns ``(array or None, count)``; built once per loaded kernel, read-only afterwards.
    """
    if tuple(cluster) == (1, 1, 1):
        return None, 0
    attrs = (CUlaunchAttribute * 1)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attrs[0].value.clusterDim[:] = list(cluster)
    return attrs, 1


_P = POINTER
# name -> (restype is always CUresult, argtypes). Required entry points first, then optional ones.
_SIGNATURES = {
    "cuInit": [c_uint],
    "cuDriverGetVersion": [_P(c_int)],
    "cuGetErrorName": [c_int, _P(c_char_p)],
    "cuGetErrorString": [c_int, _P(c_char_p)],
    "cuDeviceGetCount": [_P(c_int)],
    "cuDeviceGet": [_P(c_int), c_int],
    "cuDeviceGetAttribute": [_P(c_int), c_int, c_int],
    "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDevicePrimaryCtxRetain": [_P(c_void_p), c_int],
    "cuCtxGetCurrent": [_P(c_void_p)],
    "cuCtxSetCurrent": [c_void_p],
    "cuLibraryLoadData": [_P(c_void_p), c_void_p, c_void_p, c_void_p, c_uint, c_void_p, c_void_p, c_uint],
    "cuLibraryGetKernel": [_P(c_void_p), c_void_p, c_char_p],
    "cuKernelGetFunction": [_P(c_void_p), c_void_p],
    "cuKernelSetAttribute": [c_int, c_int, c_void_p, c_int],
    "cuKernelGetAttribute": [_P(c_int), c_int, c_void_p, c_int],
    "cuLaunchKernelEx": [_P(CUlaunchConfig), c_void_p, _P(c_void_p), _P(c_void_p)],
    "cuMemsetD32Async": [c_uint64, c_uint, c_size_t, c_void_p],
    "cuStreamGetCtx": [c_void_p, _P(c_void_p)],
    "cuStreamIsCapturing": [c_void_p, _P(c_int)],
    "cuStreamWaitEvent": [c_void_p, c_void_p, c_uint],
    "cuEventCreate": [_P(c_void_p), c_uint],
    "cuEventRecord": [c_void_p, c_void_p],
    "cuEventDestroy_v2": [c_void_p],
    "cuPointerGetAttribute": [c_void_p, c_int, c_uint64],
}
_OPTIONAL = {  # CUDA 12.4+: used when present, skipped on older drivers
    "cuKernelGetParamInfo": [c_void_p, c_size_t, _P(c_size_t), _P(c_size_t)],
    "cuFuncLoad": [c_void_p],
}


def _load_library():
    """Open libcuda.so.1 (tests replace this to prove a refused call never reaches the driver)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DriverNotFoundError(str(exc)) from None


class CudaDriver:
    """One initialised driver: typed entry points plus the few per-process caches the runtime needs.

    Obtain it with :func:`get`; all methods raise :class:`CudaDriverError` on failure.
    """

    def __init__(self, lib):
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise DriverTooOldError(f"the driver does not export {name}") from None
            fn.argtypes, fn.restype = argtypes, c_int
            setattr(self, "_" + name, fn)
        for name, argtypes in _OPTIONAL.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, c_int
            setattr(self, "_" + name, fn)
        self._check(self._cuInit(0), "cuInit")
        version = c_int()
        self._check(self._cuDriverGetVersion(byref(version)), "cuDriverGetVersion")
        self.version = version.value
        if self.version < MIN_DRIVER_VERSION:
            raise DriverTooOldError(f"the driver supports CUDA {self.version_string}")
        self._lock = threading.Lock()
        self._primary: dict[int, int] = {}
        self._capability: dict[int, tuple[int, int]] = {}

    @property
    def version_string(self) -> str:
        return f"{self.version // 1000}.{self.version % 1000 // 10}"

    # -- errors -------------------------------------------------------------------------------------
    def error(self, code: int, call: str) -> CudaDriverError:
        name, text = c_char_p(), c_char_p()
        self._cuGetErrorName(code, byref(name))
        self._cuGetErrorString(code, byref(text))
        return CudaDriverError(
            code, (name.value or b"CUDA_ERROR_UNKNOWN").decode(), (text.value or b"unknown error").decode(), call
        )

    def _check(self, code: int, call: str) -> None:
        if code != CUDA_SUCCESS:
            raise self.error(code, call)

    # -- devices and contexts -----------------------------------------------------------------------
    def device_count(self) -> int:
        n = c_int()
        self._check(self._cuDeviceGetCount(byref(n)), "cuDeviceGetCount")
        return n.value

    def _device(self, ordinal: int) -> int:
        dev = c_int()
        self._check(self._cuDeviceGet(byref(dev), ordinal), "cuDeviceGet")
        return dev.value

    def device_attribute(self, attribute: int, ordinal: int) -> int:
        value = c_int()
        self._check(self._cuDeviceGetAttribute(byref(value), attribute, self._device(ordinal)), "cuDeviceGetAttribute")
        return value.value

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        """``(major, minor)`` of a device, cached (the hot path asks on every launch)."""
        cc = self._capability.get(ordinal)
        if cc is None:
            cc = (self.device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal),
                  self.device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal))
            self._capability[ordinal] = cc
        return cc

    def device_name(self, ordinal: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._check(self._cuDeviceGetName(buf, 256, self._device(ordinal)), "cuDeviceGetName")
        return buf.value.decode(errors="replace")

    def primary_context(self, ordinal: int) -> int:
        """The device's primary context, retained once per process and never released."""
        ctx = self._primary.get(ordinal)
        if ctx is None:
            with self._lock:
                ctx = self._primary.get(ordinal)
                if ctx is None:
                    handle = c_void_p()
                    self._check(self._cuDevicePrimaryCtxRetain(byref(handle), self._device(ordinal)),
                                "cuDevicePrimaryCtxRetain")
                    ctx = self._primary[ordinal] = handle.value
        return ctx

    def current_context(self) -> int:
        ctx = c_void_p()
        self._check(self._cuCtxGetCurrent(byref(ctx)), "cuCtxGetCurrent")
        return ctx.value or 0

    def set_current_context(self, ctx: int) -> None:
        self._check(self._cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def bind_primary_context(self, ordinal: int) -> int | None:
        """Make the device's primary context current; return the context to restore afterwards.

        A thread with no current context keeps the primary context bound (returns ``None``: nothing to
        restore), which is what frameworks do. A thread whose current context is another one (another
        device's) gets it back through :meth:`set_current_context` with the returned handle.
        """
        primary = self.primary_context(ordinal)
        current = self.current_context()
        if current == primary:
            return None
        self.set_current_context(primary)
        return current or None

    # -- libraries and kernels ----------------------------------------------------------------------
    def library_load_data(self, image: bytes) -> int:
        """``cuLibraryLoadData`` (context-independent). The caller keeps ``image`` alive for the process."""
        lib = c_void_p()
        self._check(self._cuLibraryLoadData(byref(lib), image, None, None, 0, None, None, 0), "cuLibraryLoadData")
        return lib.value

    def library_get_kernel(self, library: int, symbol: str) -> int:
        kernel = c_void_p()
        self._check(self._cuLibraryGetKernel(byref(kernel), library, symbol.encode()), "cuLibraryGetKernel")
        return kernel.value

    def kernel_function(self, kernel: int) -> int:
        """The kernel's ``CUfunction`` in the current context, forced loaded (so capture never loads)."""
        func = c_void_p()
        self._check(self._cuKernelGetFunction(byref(func), kernel), "cuKernelGetFunction")
        if self._cuFuncLoad is not None:
            self._check(self._cuFuncLoad(func), "cuFuncLoad")
        return func.value

    def kernel_attribute(self, attribute: int, kernel: int, ordinal: int) -> int:
        value = c_int()
        self._check(self._cuKernelGetAttribute(byref(value), attribute, kernel, self._device(ordinal)),
                    "cuKernelGetAttribute")
        return value.value

    def set_kernel_attribute(self, attribute: int, value: int, kernel: int, ordinal: int) -> None:
        self._check(self._cuKernelSetAttribute(attribute, value, kernel, self._device(ordinal)),
                    "cuKernelSetAttribute")

    def kernel_param_info(self, kernel: int, count: int) -> list[tuple[int, int]] | None:
        """``[(offset, size)]`` of the first ``count`` kernel parameters, or ``None`` if the driver predates
        CUDA 12.4. (Probing past the last parameter would be an API error that sanitizers report.)"""
        if self._cuKernelGetParamInfo is None:
            return None
        table = []
        offset, size = c_size_t(), c_size_t()
        for index in range(count):
            code = self._cuKernelGetParamInfo(kernel, index, byref(offset), byref(size))
            if code == CUDA_ERROR_INVALID_VALUE:  # the kernel has fewer parameters
                break
            self._check(code, "cuKernelGetParamInfo")
            table.append((offset.value, size.value))
        return table

    # -- streams, pointers, launch ------------------------------------------------------------------
    def stream_context(self, stream: int) -> int:
        ctx = c_void_p()
        self._check(self._cuStreamGetCtx(stream, byref(ctx)), "cuStreamGetCtx")
        return ctx.value or 0

    def stream_is_capturing(self, stream: int) -> bool:
        status = c_int()
        self._check(self._cuStreamIsCapturing(stream, byref(status)), "cuStreamIsCapturing")
        return status.value != CU_STREAM_CAPTURE_STATUS_NONE

    def stream_wait_stream(self, consumer: int, producer: int) -> None:
        """Order ``consumer`` after the work queued so far on ``producer`` (an event, no host sync)."""
        event = c_void_p()
        self._check(self._cuEventCreate(byref(event), CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        try:
            self._check(self._cuEventRecord(event, producer), "cuEventRecord")
            self._check(self._cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent")
        finally:
            # Destroying a recorded event is safe: the driver frees it once the wait is resolved.
            self._cuEventDestroy_v2(event)

    def pointer_device(self, ptr: int) -> int:
        """The CUDA ordinal owning device pointer ``ptr`` (for ``__cuda_array_interface__``: it has none)."""
        ordinal = c_int()
        self._check(self._cuPointerGetAttribute(byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
                    "cuPointerGetAttribute")
        return ordinal.value

    def memset_d32(self, ptr: int, value: int, count: int, stream: int) -> None:
        """``cuMemsetD32Async``: ``count`` 32-bit words from ``ptr`` set to ``value``, in order on ``stream``."""
        self._check(self._cuMemsetD32Async(ptr, value, count, stream), "cuMemsetD32Async")

    def launch(self, func: int, grid, block, smem: int, stream: int, attrs, num_attrs: int, params) -> None:
        """``cuLaunchKernelEx``. ``params`` is a ``c_void_p`` array pointing at each packed argument."""
        config = CUlaunchConfig(grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, attrs,
                                num_attrs)
        code = self._cuLaunchKernelEx(byref(config), func, params, None)
        if code != CUDA_SUCCESS:
            raise self.error(code, "cuLaunchKernelEx")


_driver: CudaDriver | None = None
_driver_lock = threading.Lock()


def get() -> CudaDriver:
    """The process's driver, opened and initialised on first use (thread-safe)."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                _driver = CudaDriver(_load_library())
    return _driver
