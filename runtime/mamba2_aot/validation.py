"""Argument checks shared by every launch plan. Each raises a typed error naming the argument.

Plans use the ``expect_*`` helpers for what is family-specific (dtypes, ranks, shapes);
:func:`check_call` then applies what holds for every kernel (element alignment, int64 extents,
writable and non-self-overlapping outputs, no output overlapping another argument). None of this
touches the driver.
"""
from __future__ import annotations

import math
import operator
from typing import NamedTuple

from .errors import (AlignmentError, AliasingError, ArrayProtocolError, DTypeError, InvalidArgumentError, ShapeError,
                     StrideError)
from .tensors import DeviceArray

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
GRID_YZ_MAX = 65535  # gridDim.y / gridDim.z limit (gridDim.x allows 2^31 - 1)
FLOAT32_MAX = 3.4028234663852886e38


class BoundCall(NamedTuple):
    """A validated call, ready to launch (an immutable record).

    ``constants`` select the variant; ``grid`` is the launch grid (a 0 in it means nothing to do);
    ``params`` maps every kernel parameter name to its value; ``inputs``/``outputs`` are the arrays the
    kernel reads / writes (used for the device, alignment and aliasing checks); ``zeroed`` are outputs set to zero
    on the stream just before the kernel (32-bit words: the flags of kernels whose CTAs signal each other).
    """

    constants: dict
    grid: tuple[int, int, int]
    params: dict
    inputs: tuple[DeviceArray, ...]
    outputs: tuple[DeviceArray, ...]
    zeroed: tuple[DeviceArray, ...] = ()


def expect_given(**arrays) -> None:
    """Required array arguments must not be ``None``."""
    for name, value in arrays.items():
        if value is None:
            raise ArrayProtocolError(name, f"{name}: required, got None (expected a CUDA array)")


def expect_dtype(a: DeviceArray, allowed: tuple[str, ...]) -> None:
    if a.dtype not in allowed:
        raise DTypeError(a.name, f"{a.name}: expected dtype {' or '.join(allowed)}, got {a.dtype}")


def expect_rank(a: DeviceArray, ndim: int, dims: str) -> None:
    if len(a.shape) != ndim:
        raise ShapeError(a.name, f"{a.name}: expected {ndim} dims {dims}, got shape {a.shape}")


def expect_shape(a: DeviceArray, shape: tuple[int, ...], dims: str) -> None:
    expect_rank(a, len(shape), dims)
    if a.shape != shape:
        raise ShapeError(a.name, f"{a.name}: expected shape {shape} {dims}, got {a.shape}")


def expect_int(name: str, value, *, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    """An integer argument (a Python or NumPy int, not bool) in ``[minimum, maximum]``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(name, f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidArgumentError(name, f"{name}: expected an int in [{minimum}, {maximum}], got {value}")
    return value


def expect_bool(name: str, value) -> bool:
    """A flag: a bool (a NumPy bool too), or the int 0 or 1 (a Python or NumPy int). Anything else (``1.0``,
    ``"yes"``, ``None``, ``2``) raises :class:`InvalidArgumentError` naming ``name``."""
    if isinstance(value, bool):
        return value
    if str(getattr(value, "dtype", "")) == "bool" and getattr(value, "shape", None) == ():  # (numpy.bool_: no index)
        return bool(value)
    try:
        flag = operator.index(value)
    except TypeError:
        flag = None
    if flag not in (0, 1):
        raise InvalidArgumentError(name, f"{name}: expected a bool (or 0 / 1), got {type(value).__name__} {value!r}")
    return bool(flag)


def expect_dim(name: str, what: str, value: int, *, maximum: int = INT32_MAX) -> None:
    """A dimension the kernel receives as a 32-bit int (or a grid dim, with a smaller ``maximum``)."""
    if value > maximum:
        raise ShapeError(name, f"{name}: {what} = {value} exceeds the kernel's limit {maximum}")


def expect_float32(name: str, value) -> float:
    """A real number representable as fp32 (infinities allowed, NaN not)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, f"{name}: expected a real number, got {value!r}") from None
    if math.isnan(value) or (math.isfinite(value) and abs(value) > FLOAT32_MAX):
        raise InvalidArgumentError(name, f"{name}: {value} is NaN or outside the fp32 range")
    return value


def stride_names(array: str, *dims: str) -> tuple[str, ...]:
    """The kernel parameters ``stride_<array>_<dim>`` (the rule the kernels' ``abi.strides`` declares them by;
    dims have no underscore)."""
    return tuple(f"stride_{array}_{d}" for d in dims)


def record_strides(params: dict, arr: DeviceArray, dims: tuple[str, ...]) -> None:
    """Record ``stride_<name>_<dim>`` for the dims the kernel takes a stride for.

    Naming one dim fewer than the array has means the kernel assumes the last dim contiguous.
    """
    if len(dims) < len(arr.shape):
        expect_contiguous_last_dim(arr)
    params.update(zip(stride_names(arr.name, *dims), arr.strides))


def expect_contiguous_last_dim(arr: DeviceArray) -> None:
    """A StrideError unless ``arr``'s last dim is contiguous (or has one element)."""
    if arr.strides[-1] != 1 and arr.shape[-1] > 1:
        raise StrideError(arr.name, f"{arr.name}: the last dim must be contiguous (stride 1), got strides "
                          f"{arr.strides}")


def vector_misfit(a: DeviceArray, width: int = 16) -> str | None:
    """Why the rows of ``a`` (its contiguous last dim) cannot move in ``width``-byte vectors: "pointer" (the base
    is not ``width``-byte aligned) or "strides" (an outer stride, of a dim longer than 1, is not a whole number of
    ``width`` bytes); None when they can. The kernels that move rows this way check it once here."""
    if a.ptr % width:
        return "pointer"
    if any(s * a.itemsize % width for s, n in zip(a.strides[:-1], a.shape) if n > 1):
        return "strides"
    return None


def expect_state_blocks(arr: DeviceArray, d_state: int, block: str) -> None:
    """A state array whose ``block`` blocks (e.g. "(sequence, head)") are contiguous headdim × d_state matrices, as
    the kernels address them."""
    if arr.strides[-2:] != (d_state, 1):
        raise StrideError(arr.name, f"{arr.name}: each {block} block must be a contiguous headdim × d_state matrix "
                          f"(strides (..., {d_state}, 1)), got strides {arr.strides}")


def null_absent(params: dict, param_names: tuple[str, ...], names) -> None:
    """Arrays a call does not pass: a null pointer and zero strides for each of ``names`` not in ``params``
    (or given as a null pointer)."""
    for name in names:
        if not params.get(name):
            params[name] = 0
            prefix = f"stride_{name}_"
            params.update((p, 0) for p in param_names if p.startswith(prefix) and "_" not in p[len(prefix):])


def expect_complete(params: dict, param_names: tuple[str, ...], family: str) -> None:
    """Every kernel parameter has a value (a plan bug otherwise, not a caller's)."""
    missing = set(param_names) - set(params)
    if missing:
        raise RuntimeError(f"{family} plan left kernel parameters unset: {sorted(missing)}")


def check_call(call: BoundCall) -> None:
    """The checks every kernel needs, after the plan's own: see the module docstring."""
    arrays = call.inputs + call.outputs
    spans = [_checked_span(a) for a in arrays]
    first_output = len(call.inputs)
    for i, out in enumerate(call.outputs, start=first_output):
        if out.readonly:
            raise InvalidArgumentError(out.name, f"{out.name}: is read-only but the kernel writes it")
        if has_internal_overlap(out.shape, out.strides):
            raise StrideError(out.name, f"{out.name}: strides {out.strides} for shape {out.shape} make elements "
                              "overlap (e.g. a broadcast, stride-0 view); the kernel writes it, pass a distinct "
                              "buffer")
        span = spans[i]
        if span is None:
            continue
        for other, other_span in zip(arrays[:i], spans[:i]):
            if other_span is not None and span[0] < other_span[1] and other_span[0] < span[1]:
                raise AliasingError(out.name, f"{out.name}: its memory overlaps {other.name}'s (bytes "
                                    f"[{span[0]:#x}, {span[1]:#x}) and [{other_span[0]:#x}, {other_span[1]:#x})); "
                                    "outputs must not share memory with inputs or other outputs")
    for words in call.zeroed:  # set by cuMemsetD32Async: whole 32-bit words, one run
        if words not in call.outputs or words.dtype not in ("int32", "fp32") or words.strides != (1,):
            raise RuntimeError(f"{words.name}: a plan asked to zero {words.shape} {words.dtype} strides "
                               f"{words.strides}, not a contiguous 1-D 32-bit output of its call (a plan bug)")


def _checked_span(a: DeviceArray) -> tuple[int, int] | None:
    """``a.byte_range()`` after checking the pointer (non-null, element-aligned) and the int64 extent.

    Strides themselves are int64 in every exporter (torch, DLPack's ``int64_t``, CAI producers)."""
    span = a.byte_range()
    if span is None:
        return None  # empty: never dereferenced
    if a.ptr == 0:
        raise ArrayProtocolError(a.name, f"{a.name}: a non-empty array with a null data pointer")
    if a.ptr % a.itemsize:
        raise AlignmentError(a.name, f"{a.name}: data pointer {a.ptr:#x} is not aligned to its {a.dtype} element "
                             f"size ({a.itemsize} bytes)")
    if span[1] - span[0] > INT64_MAX:
        raise ShapeError(a.name, f"{a.name}: spans more than 2^63 bytes")
    return span


def has_internal_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two indices of an array of ``shape`` and (element) ``strides`` can address one element.

    Conservative: sorted by |stride|, each dim must step past everything the smaller dims reach. This
    accepts every dense or sliced view (what frameworks produce) and refuses some exotic interleavings
    that do not actually overlap, which is the safe direction for an output. An empty array has no elements.
    """
    if 0 in shape:
        return False
    reach = 0
    for stride, extent in sorted([(abs(s), d) for d, s in zip(shape, strides) if d > 1]):
        if stride <= reach:
            return True
        reach += (extent - 1) * stride
    return False


def expect_mode_args(mode: str, needed_by_mode: dict, **given) -> None:
    """The arrays a mode needs (``needed_by_mode[mode]``) must be given, and those it does not use must not be
    (passing one is a likely caller mistake)."""
    needed = needed_by_mode.get(mode, ())
    for name, value in given.items():
        if name in needed and value is None:
            raise InvalidArgumentError(name, f"{name}: required in {mode} mode")
        if name not in needed and value is not None:
            takes = f" (it takes {', '.join(needed)})" if needed else ""
            raise InvalidArgumentError(name, f"{name}: not used in {mode} mode{takes}")


def expect_dt_limit(dt_limit) -> tuple[float, float]:
    """``dt_limit = (lo, hi)``: two fp32-representable bounds with lo <= hi."""
    try:
        lo, hi = dt_limit
    except (TypeError, ValueError):
        raise InvalidArgumentError("dt_limit", f"dt_limit: expected a pair (lo, hi), got {dt_limit!r}") from None
    lo, hi = expect_float32("dt_limit", lo), expect_float32("dt_limit", hi)
    if lo > hi:
        raise InvalidArgumentError("dt_limit", f"dt_limit: lo {lo} is greater than hi {hi}")
    return lo, hi
