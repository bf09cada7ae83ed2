"""CPU tests of the array adapters (``__cuda_array_interface__``, DLPack, torch) and stream handles."""
from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba2_aot import ArrayProtocolError, DeviceError, DTypeError, StreamError, StrideError
from mamba2_aot.streams import as_dlpack_stream, default_stream, resolve, stream_handle
from mamba2_aot.tensors import DeviceArray, as_device_array
from mamba2_aot.validation import has_internal_overlap
from runtime_fakes import FakeCAI, FakeDLPack, OnlyDLPack

# -- __cuda_array_interface__ -----------------------------------------------------------------------------


@pytest.mark.parametrize("typestr,dtype", [("<f2", "fp16"), ("<f4", "fp32"), ("<i4", "int32"), ("<i8", "int64"),
                                            ("=f4", "fp32")])
def test_cai_dtypes(typestr, dtype):
    a = as_device_array(FakeCAI(0x1000, (2, 3), typestr), "x")
    assert a.dtype == dtype and a.shape == (2, 3) and a.strides == (3, 1) and a.ptr == 0x1000
    assert a.device is None  # CAI has no device: resolved from the pointer at launch


def test_cai_byte_strides_become_element_strides():
    a = as_device_array(FakeCAI(0x1000, (4, 5, 6), "<f4", strides=(480, 4, 20), stream=7), "x")
    assert a.strides == (120, 1, 5)
    assert a.stream == 7


def test_cai_stride_not_multiple_of_itemsize():
    with pytest.raises(StrideError, match="^x: byte strides"):
        as_device_array(FakeCAI(0x1000, (4,), "<f4", strides=(6,)), "x")


def test_cai_readonly_and_mask():
    assert as_device_array(FakeCAI(0x1000, (4,), readonly=True), "x").readonly
    with pytest.raises(ArrayProtocolError, match="^x: masked"):
        as_device_array(FakeCAI(0x1000, (4,), mask=object()), "x")


def test_cai_unknown_typestr_without_dlpack_names_argument():
    with pytest.raises(DTypeError, match=r"^dt: .*'<V2'.*DLPack") as info:
        as_device_array(FakeCAI(0x1000, (4,), "<V2"), "dt")
    assert info.value.argument == "dt"


def test_cai_preferred_over_dlpack():
    class Both(FakeDLPack):
        __cuda_array_interface__ = FakeCAI(0x2000, (3,)).__cuda_array_interface__

    obj = Both(0x1000, (3,))
    assert as_device_array(obj, "x").ptr == 0x2000
    assert obj.requests == []  # no capsule was asked for


def test_cai_that_raises_falls_back_to_dlpack():
    class Bf16Export(FakeDLPack):  # torch raises TypeError for bf16 __cuda_array_interface__
        @property
        def __cuda_array_interface__(self):
            raise TypeError("dtype bfloat16 is not supported")

    a = as_device_array(Bf16Export(0x1000, (3,), code=4, bits=16), "x")
    assert a.dtype == "bf16"


def _malformed_cai(change):
    obj = FakeCAI(0x1000, (2, 3), strides=(12, 4))
    change(obj.__cuda_array_interface__)
    return obj


_DATA = "'data' must be a (pointer, readonly) pair"


@pytest.mark.parametrize("change,fragment", [
    pytest.param(lambda cai: cai.pop("data"), _DATA + ", got None", id="no-data"),
    pytest.param(lambda cai: cai.update(data=0x1000), _DATA, id="data-not-a-pair"),
    pytest.param(lambda cai: cai.update(data=(0x1000,)), _DATA, id="data-one-item"),
    pytest.param(lambda cai: cai.update(data=("0x1000", False)), _DATA, id="pointer-a-string"),
    pytest.param(lambda cai: cai.update(data=(-4096, False)), _DATA, id="pointer-negative"),
    pytest.param(lambda cai: cai.update(data=(1 << 64, False)), _DATA, id="pointer-over-64-bits"),
    pytest.param(lambda cai: cai.update(data=(0x1000, "no")), _DATA, id="readonly-a-string"),
    pytest.param(lambda cai: cai.pop("shape"), "'shape' must be a tuple of ints, got None", id="no-shape"),
    pytest.param(lambda cai: cai.update(shape=(2.0, 3)), "'shape' must be a tuple of ints", id="shape-float"),
    pytest.param(lambda cai: cai.update(shape=("2", 3)), "'shape' must be a tuple of ints", id="shape-string"),
    pytest.param(lambda cai: cai.update(shape=(2, -3)), "shape (2, -3) has a negative dim", id="shape-negative"),
    pytest.param(lambda cai: cai.update(strides=(12.0, 4)), "'strides' must be a tuple of ints", id="strides-float"),
    pytest.param(lambda cai: cai.update(strides=(4,)), "strides (4,) do not match shape (2, 3)", id="strides-rank"),
])
def test_cai_malformed_export_names_argument(change, fragment):
    with pytest.raises(ArrayProtocolError) as info:
        as_device_array(_malformed_cai(change), "dt")
    assert info.value.argument == "dt" and str(info.value).startswith("dt: ")
    assert fragment in str(info.value)


def test_cai_numpy_ints_and_null_pointer_accepted():
    np = pytest.importorskip("numpy")
    a = as_device_array(_malformed_cai(lambda cai: cai.update(shape=(np.int64(2), np.int32(3)),
                                                               strides=(np.int64(12), 4))), "x")
    assert a.shape == (2, 3) and a.strides == (3, 1) and all(type(d) is int for d in a.shape + a.strides)
    assert as_device_array(_malformed_cai(lambda cai: cai.update(data=(None, False), shape=(0, 3))), "x").ptr == 0


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(-50, 50)), min_size=0, max_size=4),
       st.sampled_from([("<f2", 2), ("<f4", 4), ("<i8", 8)]))
def test_cai_strides_property(dims, dtype):
    typestr, itemsize = dtype
    shape = tuple(d for d, _ in dims)
    strides = tuple(s for _, s in dims)
    a = as_device_array(FakeCAI(0x10000, shape, typestr, strides=tuple(s * itemsize for s in strides)), "x")
    assert a.shape == shape and a.strides == strides and a.itemsize == itemsize


# -- DLPack -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code,bits,dtype", [(2, 16, "fp16"), (2, 32, "fp32"), (4, 16, "bf16"), (0, 32, "int32"),
                                             (0, 64, "int64")])
@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_dtypes(code, bits, dtype, versioned):
    obj = FakeDLPack(0x4000, (2, 3), code=code, bits=bits, device=(2, 1), versioned=versioned)
    a = as_device_array(obj, "x")
    assert (a.dtype, a.shape, a.strides, a.device, a.ptr) == (dtype, (2, 3), (3, 1), 1, 0x4000)


def test_dlpack_strides_and_byte_offset():
    a = as_device_array(FakeDLPack(0x4000, (4, 5), strides=(1, 8), byte_offset=64), "x")
    assert a.strides == (1, 8) and a.ptr == 0x4040


def test_dlpack_old_producer_without_max_version():
    obj = FakeDLPack(0x4000, (3,), old_producer=True)
    assert as_device_array(obj, "x").shape == (3,)
    assert obj.requests == [{"stream": None, "max_version": None}]


def test_dlpack_passes_the_launch_stream():
    obj = FakeDLPack(0x4000, (3,))
    as_device_array(obj, "x", dlpack_stream=0x77)
    assert obj.requests[0] == {"stream": 0x77, "max_version": (1, 0)}


def test_dlpack_capsule_destroyed_exactly_once():
    obj = FakeDLPack(0x4000, (3,))
    as_device_array(obj, "x")
    gc.collect()
    assert obj.destroyed == 1  # not consumed by us: the capsule's destructor ran, once


def test_dlpack_readonly_flag():
    assert as_device_array(FakeDLPack(0x4000, (3,), flags=1), "x").readonly


@pytest.mark.parametrize("device,where", [((1, 0), "cpu"), ((3, 0), "pinned host")])
def test_dlpack_host_memory_refused_before_export(device, where):
    obj = FakeDLPack(0x4000, (3,), device=device)
    with pytest.raises(DeviceError, match=f"^A: .*{where}") as info:
        as_device_array(obj, "A")
    assert info.value.argument == "A" and obj.requests == []


def test_dlpack_unsupported_dtype_and_version():
    with pytest.raises(DTypeError, match=r"^x: DLPack dtype \(code=2, bits=64"):
        as_device_array(FakeDLPack(0x4000, (3,), bits=64), "x")
    with pytest.raises(DTypeError, match="lanes=4"):
        as_device_array(FakeDLPack(0x4000, (3,), lanes=4), "x")
    with pytest.raises(ArrayProtocolError, match="DLPack version 2.0"):
        as_device_array(FakeDLPack(0x4000, (3,), major=2), "x")


def test_dlpack_negative_dim_names_argument():
    with pytest.raises(ArrayProtocolError, match=r"^dt: DLPack shape \(2, -1\) has a negative dim") as info:
        as_device_array(FakeDLPack(0x4000, (2, -1)), "dt")
    assert info.value.argument == "dt"


def test_numpy_cpu_array_refused():
    np = pytest.importorskip("numpy")
    with pytest.raises(DeviceError, match="^dt: .*cpu"):
        as_device_array(np.zeros(3, np.float32), "dt")


def test_not_an_array():
    with pytest.raises(ArrayProtocolError, match="^dt_bias: expected a CUDA array.*list") as info:
        as_device_array([1.0, 2.0], "dt_bias")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


# -- torch ------------------------------------------------------------------------------------------------


def test_torch_cpu_tensor_refused():
    with pytest.raises(DeviceError, match="^dt: expected a CUDA tensor, got a tensor on cpu"):
        as_device_array(torch.zeros(2, 3), "dt")


def test_torch_cpu_tensor_refused_through_dlpack_too():
    # The same refusal without the torch fast path: only the protocol is visible.
    with pytest.raises(DeviceError, match="^dt: .*cpu"):
        as_device_array(OnlyDLPack(torch.zeros(3)), "dt")


# -- geometry helpers -------------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-6, 6)), min_size=1, max_size=3))
def test_byte_range_and_overlap_against_brute_force(dims):
    shape = tuple(d for d, _ in dims)
    strides = tuple(s for _, s in dims)
    a = DeviceArray("x", 1 << 20, shape, strides, "fp32", 0)
    offsets = [0]
    for extent, stride in dims:
        offsets = [o + i * stride for o in offsets for i in range(extent)]
    if not offsets:
        assert a.byte_range() is None
        return
    assert a.byte_range() == ((1 << 20) + min(offsets) * 4, (1 << 20) + (max(offsets) + 1) * 4)
    if len(set(offsets)) != len(offsets):
        assert has_internal_overlap(a.shape, a.strides)  # conservative: a real overlap is always caught


def test_an_empty_array_never_overlaps_itself():
    """No element, no overlap: an empty output with broadcast strides (a plan's empty workspace region) is fine,
    the same strides with an element are refused."""
    strides = (0, 64, 1)
    assert not has_internal_overlap((2, 0, 64), strides)
    assert has_internal_overlap((2, 1, 64), strides)


# -- streams ----------------------------------------------------------------------------------------------


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0xABC)


class _PropertyStream:
    __cuda_stream__ = (0, 0xDEF)


class _TorchLike:
    cuda_stream = 0x111


class _CupyLike:
    ptr = 0x222


@pytest.mark.parametrize("stream,handle", [(0, 0), (2, 2), (0x7F00, 0x7F00), (_ProtocolStream(), 0xABC),
                                           (_PropertyStream(), 0xDEF), (_TorchLike(), 0x111), (_CupyLike(), 0x222)])
def test_stream_handles(stream, handle):
    assert stream_handle(stream) == handle


@pytest.mark.parametrize("bad", [True, -1, "0", 1.5, object()])
def test_bad_stream(bad):
    with pytest.raises(StreamError, match="^stream: ") as info:
        stream_handle(bad)
    assert info.value.argument == "stream"


def test_default_stream_without_cuda_tensors_is_legacy_default():
    assert default_stream([torch.zeros(1), FakeCAI(0x1000, (1,)), 3]) == 0
    assert resolve(None, []) == 0 and resolve(5, []) == 5


def test_dlpack_stream_convention():
    assert as_dlpack_stream(0) == 1 and as_dlpack_stream(2) == 2 and as_dlpack_stream(0x99) == 0x99
