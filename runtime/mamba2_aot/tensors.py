"""Framework-agnostic device arrays: read pointer, shape, strides, dtype and device from any tensor.

Accepted, in this order of preference:

1. ``torch.Tensor`` (only looked for when torch is already imported): read directly (``data_ptr()``,
   ``stride()``, ...). This is the hot path of most callers and is several times cheaper than either
   protocol below; it reads exactly what torch's own ``__dlpack__`` would export.
2. ``__cuda_array_interface__`` (v2/v3; CuPy, Numba, JAX, PyTorch): preferred over DLPack because
   reading it consumes nothing. It carries no device, so ``device`` is left ``None`` and resolved from
   the pointer by the caller (:func:`mamba2_aot.driver.CudaDriver.pointer_device`). A ``stream`` entry
   (v3) is kept so the launch can be ordered after the producer's work.
3. ``__dlpack__`` / ``__dlpack_device__`` (any array-API library): the capsule is parsed with ctypes
   (``DLManagedTensorVersioned`` for DLPack >= 1.0 producers, else ``DLManagedTensor``). It is *not*
   renamed as consumed, so its own destructor calls the producer's deleter when it is dropped; the
   memory stays valid because the caller keeps the producer object alive for the whole call.

bf16 cannot be written as a ``__cuda_array_interface__`` typestr; such arrays are read through DLPack
(``kDLBfloat``). Anything not in CUDA device memory (CPU, pinned host) is refused, naming the argument,
and so is a malformed export (a CAI without a ``(pointer, readonly)`` ``data`` pair, non-integer shape or
strides, a negative dim from CAI or DLPack).
"""
from __future__ import annotations

import ctypes
import math
import operator
import sys
from typing import NamedTuple

from .errors import ArrayProtocolError, DeviceError, DTypeError, StrideError

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8}

# __cuda_array_interface__ typestr -> dtype name ('<' little-endian; '=' native, which CUDA hosts are).
_TYPESTR = {"f2": "fp16", "f4": "fp32", "i4": "int32", "i8": "int64"}

# DLPack (type code, bits) -> dtype name; lanes must be 1.
_KDL_INT, _KDL_FLOAT, _KDL_BFLOAT = 0, 2, 4
_DLPACK_DTYPE = {(_KDL_FLOAT, 16): "fp16", (_KDL_FLOAT, 32): "fp32", (_KDL_BFLOAT, 16): "bf16",
                 (_KDL_INT, 32): "int32", (_KDL_INT, 64): "int64"}
# DLPack device types that are CUDA device memory (kDLCUDA, kDLCUDAManaged).
_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_DLPACK_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host (pinned host memory)", 4: "opencl", 7: "vulkan",
                        8: "metal", 10: "rocm", 13: "cuda_managed", 14: "oneapi"}
_DLPACK_FLAG_READ_ONLY = 1


class DeviceArray(NamedTuple):
    """A strided view of device memory, as a kernel sees it (an immutable record).

    ``ptr`` is the address of element [0, ..., 0]; ``strides`` are in elements (may be 0 or negative);
    ``dtype`` is one of ``bf16, fp16, fp32, int32, int64``; ``device`` the CUDA ordinal, or ``None``
    until resolved from the pointer; ``stream`` the producer stream named by a CAI v3 export, if any.
    (A NamedTuple rather than a frozen dataclass: it is built several times per launch, and cheaply.)
    """

    name: str
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    device: int | None
    readonly: bool = False
    stream: int | None = None

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def byte_range(self) -> tuple[int, int] | None:
        """``[lo, hi)`` bytes spanned by the elements (``None`` if empty): the basis of aliasing checks."""
        lo = hi = 0
        for extent, stride in zip(self.shape, self.strides):
            if extent == 0:
                return None
            reach = (extent - 1) * stride
            if reach < 0:
                lo += reach
            else:
                hi += reach
        itemsize = ITEMSIZE[self.dtype]
        return self.ptr + lo * itemsize, self.ptr + (hi + 1) * itemsize

    def region(self, name: str, byte_offset: int, shape: tuple, dtype: str) -> DeviceArray:
        """A C-contiguous ``shape`` array of ``dtype`` in this array's memory from ``byte_offset``: how a
        workspace is carved into the arrays the kernels take (same device, stream and writability)."""
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return DeviceArray(name, self.ptr + byte_offset, shape, strides, dtype, self.device, readonly=self.readonly,
                           stream=self.stream)


def as_device_array(obj, name: str, *, dlpack_stream: int | None = None) -> DeviceArray:
    """Read a CUDA array from ``obj`` (torch tensor, ``__cuda_array_interface__`` or ``__dlpack__``).

    ``dlpack_stream`` is the stream the kernel will run on, in DLPack's convention (1 = legacy default,
    2 = per-thread default, else a handle; ``None`` = legacy default): a DLPack producer orders its
    pending work before that stream. Raises :class:`ArrayProtocolError` (not an array),
    :class:`ArrayProtocolError` also for a malformed export (bad CAI ``data``/``shape``/``strides``, a
    negative dim), :class:`DeviceError` (not CUDA device memory), :class:`DTypeError` (unsupported element
    type) or :class:`StrideError` (strides not a multiple of the element size), each naming ``name``.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj, name, torch)
    cai = _cuda_array_interface(obj)
    if cai is not None:
        array = _from_cai(cai, name)
        if array is not None:
            return array
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, name, dlpack_stream)
    if cai is not None:  # CAI present but its typestr has no dtype we know, and no DLPack to fall back to
        raise DTypeError(name, f"{name}: __cuda_array_interface__ typestr {cai.get('typestr')!r} is not one of "
                         f"{_expected_dtypes()} (bf16 arrays must be passed through DLPack)")
    raise ArrayProtocolError(name, f"{name}: expected a CUDA array (an object with __cuda_array_interface__ or "
                             f"__dlpack__, e.g. a torch or CuPy array), got {type(obj).__name__}")


def _expected_dtypes() -> str:
    return ", ".join(ITEMSIZE)


# -- torch ----------------------------------------------------------------------------------------------
_torch_dtypes: dict | None = None


def _from_torch(t, name: str, torch) -> DeviceArray:
    global _torch_dtypes
    if _torch_dtypes is None:
        _torch_dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                         torch.int32: "int32", torch.int64: "int64"}
    if not t.is_cuda:
        raise DeviceError(name, f"{name}: expected a CUDA tensor, got a tensor on {t.device}")
    dtype = _torch_dtypes.get(t.dtype)
    if dtype is None:
        raise DTypeError(name, f"{name}: dtype {t.dtype} is not supported (supported: {_expected_dtypes()})")
    return DeviceArray(name, t.data_ptr(), tuple(t.shape), t.stride(), dtype, t.get_device())


# -- __cuda_array_interface__ ---------------------------------------------------------------------------
def _cuda_array_interface(obj) -> dict | None:
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return None
    except (TypeError, ValueError, RuntimeError):
        # Some exporters raise for dtypes CAI cannot express (torch: bf16); DLPack may still work.
        return {}


def _from_cai(cai: dict, name: str) -> DeviceArray | None:
    """A DeviceArray from a CAI dict, or ``None`` if the dtype needs DLPack instead."""
    typestr = cai.get("typestr", "")
    dtype = _TYPESTR.get(typestr[1:]) if typestr[:1] in "<=" else None
    if dtype is None:
        return None
    if cai.get("mask") is not None:
        raise ArrayProtocolError(name, f"{name}: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    ptr, readonly = _cai_data(cai.get("data"), name)
    shape = _cai_ints(cai.get("shape"), name, "shape")
    _check_dims(shape, name, "__cuda_array_interface__")
    itemsize = ITEMSIZE[dtype]
    byte_strides = cai.get("strides")
    if byte_strides is None:
        strides = _contiguous_strides(shape)
    else:
        byte_strides = _cai_ints(byte_strides, name, "strides")
        if len(byte_strides) != len(shape):
            raise ArrayProtocolError(name, f"{name}: __cuda_array_interface__ strides {byte_strides} do not match "
                                     f"shape {shape}")
        if any(s % itemsize for s in byte_strides):
            raise StrideError(name, f"{name}: byte strides {byte_strides} are not multiples of the "
                              f"{dtype} element size {itemsize}")
        strides = tuple(s // itemsize for s in byte_strides)
    return DeviceArray(name, ptr, shape, strides, dtype, None, readonly, cai.get("stream"))


def _cai_data(data, name: str) -> tuple[int, bool]:
    """CAI ``data``: a ``(pointer, readonly)`` pair, the pointer a 64-bit address (``None``: an empty array)
    and ``readonly`` a bool. Raises :class:`ArrayProtocolError` naming ``name`` otherwise."""
    try:
        ptr, readonly = data
        ptr = 0 if ptr is None else _cai_int(ptr)
        if not 0 <= ptr < 1 << 64 or not isinstance(readonly, (bool, int)):
            raise ValueError
    except (TypeError, ValueError):
        raise ArrayProtocolError(name, f"{name}: __cuda_array_interface__ 'data' must be a (pointer, readonly) pair, "
                                 f"got {data!r}") from None
    return ptr, bool(readonly)


def _cai_ints(value, name: str, field: str) -> tuple[int, ...]:
    """CAI ``shape`` or ``strides``: a sequence of ints. Raises :class:`ArrayProtocolError` naming ``name``."""
    try:
        return tuple(_cai_int(v) for v in value)
    except TypeError:
        raise ArrayProtocolError(name, f"{name}: __cuda_array_interface__ '{field}' must be a tuple of ints, got "
                                 f"{value!r}") from None


def _cai_int(value) -> int:
    """A Python or NumPy int (not a bool, float or string); ``TypeError`` otherwise."""
    if isinstance(value, bool):
        raise TypeError
    return operator.index(value)


def _check_dims(shape: tuple[int, ...], name: str, source: str) -> None:
    """Refuse a negative dim (:class:`ArrayProtocolError` naming ``name``); torch cannot produce one."""
    if any(d < 0 for d in shape):
        raise ArrayProtocolError(name, f"{name}: {source} shape {shape} has a negative dim")


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


# -- DLPack ---------------------------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor),
    ]


_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.argtypes, _PyCapsule_IsValid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.argtypes, _PyCapsule_GetPointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p


def _check_dlpack_device(device_type: int, name: str) -> None:
    if device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        where = _DLPACK_DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")
        raise DeviceError(name, f"{name}: expected CUDA device memory, got an array on {where}")


def _from_dlpack(obj, name: str, stream: int | None) -> DeviceArray:
    if hasattr(obj, "__dlpack_device__"):
        # Refuse host arrays before asking for a capsule (and before passing them a CUDA stream).
        _check_dlpack_device(int(obj.__dlpack_device__()[0]), name)
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0 (no max_version keyword)
        capsule = obj.__dlpack__(stream=stream)
    return dlpack_capsule_to_array(capsule, name)


def dlpack_capsule_to_array(capsule, name: str) -> DeviceArray:
    """Read a DLPack capsule (``dltensor`` or ``dltensor_versioned``) without consuming it.

    The capsule keeps ownership: when it is dropped, its destructor calls the producer's deleter, so
    nothing leaks and nothing is freed twice. The data pointer stays valid only while the producer
    array lives; callers keep it referenced for the duration of the launch.
    """
    readonly = False
    if _PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(_PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        if managed.major != 1:
            raise ArrayProtocolError(name, f"{name}: DLPack version {managed.major}.{managed.minor} is not "
                                     "supported (expected 1.x)")
        readonly = bool(managed.flags & _DLPACK_FLAG_READ_ONLY)
        tensor = managed.dl_tensor
    elif _PyCapsule_IsValid(capsule, b"dltensor"):
        tensor = _DLManagedTensor.from_address(_PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        raise ArrayProtocolError(name, f"{name}: __dlpack__ returned {type(capsule).__name__}, not an unconsumed "
                                 "DLPack capsule")
    _check_dlpack_device(tensor.device.device_type, name)
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    dtype = _DLPACK_DTYPE.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        raise DTypeError(name, f"{name}: DLPack dtype (code={code}, bits={bits}, lanes={lanes}) is not supported "
                         f"(supported: {_expected_dtypes()})")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    _check_dims(shape, name, "DLPack")
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else _contiguous_strides(shape)
    ptr = (tensor.data or 0) + tensor.byte_offset
    return DeviceArray(name, ptr, shape, strides, dtype, tensor.device.device_id, readonly)
