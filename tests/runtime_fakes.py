"""Fakes shared by the runtime's CPU tests (no test functions here).

* :class:`FakeCAI` / :class:`FakeDLPack`: device arrays exposing ``__cuda_array_interface__`` or a
  hand-made DLPack capsule, at made-up addresses (nothing is dereferenced on the CPU).
* :func:`write_cubin_dir`: a manifest plus fake cubins for ``ssd_chunk_cumsum``, laid out like a build;
  :func:`mark_unvalidated` turns some of its variants into unvalidated builds.
* :class:`FakeDriver`: stands in for :class:`mamba2_aot.driver.CudaDriver` and records every call.
* fixtures ``no_driver`` (opening the driver fails the test) and ``fake_runtime`` (fake cubins + FakeDriver).
* :func:`corrupt_one_argument`: one array of a valid call (:func:`expect_valid_call`) made wrong, for property tests
  of the refusals.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from pathlib import Path

import pytest

import mamba2_aot
from mamba2_aot import dispatch, driver, errors, manifest
from mamba2_aot.plans.ssd_chunk_cumsum import ChunkCumsumPlan

# The kinds of ssd_chunk_cumsum's kernel parameters, in ChunkCumsumPlan.param_names order.
CUMSUM_KINDS = ["ptr"] * 5 + ["i32"] * 4 + ["i64"] * 13 + ["i32", "i32", "f32", "f32"]
KIND_SIZES = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4}


def c_layout(names, kinds):
    """Naturally aligned C layout, as the build writes it into the manifest."""
    rows, offset = [], 0
    for name, kind in zip(names, kinds):
        size = KIND_SIZES[kind]
        offset = -(-offset // size) * size
        rows.append({"name": name, "kind": kind, "size": size, "offset": offset})
        offset += size
    return rows


class FakeCAI:
    """An object exposing only ``__cuda_array_interface__`` (v3)."""

    def __init__(self, ptr, shape, typestr="<f4", strides=None, readonly=False, stream=None, mask=None):
        self.__cuda_array_interface__ = {
            "version": 3, "data": (ptr, readonly), "shape": tuple(shape), "typestr": typestr, "strides": strides,
            "stream": stream,
        }
        if mask is not None:
            self.__cuda_array_interface__["mask"] = mask


def contiguous(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def fake_array(ptr, shape, dtype="fp32", strides=None):
    """A FakeCAI array of ``dtype`` with element ``strides`` (default C-contiguous)."""
    typestr = {"fp32": "<f4", "fp16": "<f2", "int32": "<i4", "int64": "<i8"}[dtype]
    itemsize = int(typestr[2:])
    strides = contiguous(shape) if strides is None else strides
    return FakeCAI(ptr, shape, typestr, tuple(s * itemsize for s in strides))


def _cai(arr) -> dict:
    return arr.__cuda_array_interface__


def _arrays(args: dict, *, nonempty: bool = False) -> list:
    """The names of a call's array arguments (with ``nonempty``: those holding an element, which a kernel may
    dereference)."""
    return sorted(k for k, v in args.items() if hasattr(v, "__cuda_array_interface__")
                  and not (nonempty and 0 in _cai(v)["shape"]))


def corruption_kinds(args: dict, name: str, outputs, *, free_dims=None, least_elements=None, vectors=(), blocks=(),
                     free_last_stride=()) -> list:
    """The kinds of wrong :func:`corrupt_one_argument` can make of array ``name`` of the valid call ``args``:
    ``dtype`` (a dtype it does not take), ``dim`` (a dim off by one, but not one of ``free_dims[name]``), ``rank``
    (a trailing dim of 1 more), ``readonly`` (an output); for a non-empty array (an empty one is never dereferenced)
    ``null`` (at address 0), ``misaligned`` (a byte off), ``unaligned`` and ``padded`` (for ``vectors``, arrays
    moved 16 bytes at a time: an element off, and its outermost stride one element longer), ``strided`` (every
    other element of a last dim of more than one, unless the kernels take any stride there: ``free_last_stride``),
    ``gapped`` (for ``blocks``, arrays of contiguous headdim × d_state blocks: each block row 16 bytes longer, so
    that only the block rule is broken), ``alias`` (an output at another argument's address), ``broadcast`` (an
    output with stride 0 along a dim of more than one element); ``short`` (an argument of ``least_elements``, 1-D,
    one element short of that)."""
    free_dims, least_elements = free_dims or {}, least_elements or {}
    shape = _cai(args[name])["shape"]
    kinds = ["dtype"] + (["dim"] if set(range(len(shape))) - set(free_dims.get(name, ())) else []) + ["rank"]
    kinds += ["readonly"] if name in outputs else []
    if name in _arrays(args, nonempty=True):
        kinds += ["null", "misaligned"] + (["unaligned", "padded"] if name in vectors else [])
        kinds += ["strided"] if shape[-1] > 1 and name not in free_last_stride else []
        kinds += ["gapped"] if name in blocks and shape[-2] > 1 else []
        kinds += ["alias"] + (["broadcast"] if max(shape) > 1 else []) if name in outputs else []
    return kinds + (["short"] if least_elements.get(name) else [])


def corruption_targets(calls, outputs, **exemptions) -> list:
    """Every (argument, kind) :func:`corruption_kinds` gives for any of the valid ``calls``: what a property test
    parametrizes over, so that no pair goes undrawn (hypothesis' draws, derandomized, skip many)."""
    return sorted({(name, kind) for args in calls for name in _arrays(args)
                   for kind in corruption_kinds(args, name, outputs, **exemptions)})


def corrupt_one_argument(data, args: dict, outputs, target: tuple, *, dtypes=None, free_dims=None,
                         least_elements=None, vectors=(), blocks=(), free_last_stride=(), in_place=()):
    """Make argument ``target[0]`` of a valid call of FakeCAI arrays wrong in the way ``target[1]`` names
    (:func:`corruption_kinds`), its details drawn with hypothesis' ``data``; an example whose call cannot be made
    wrong that way (an empty array, a dim the call leaves free) is rejected. ``dtypes`` maps an argument to the
    typestrs it also takes; ``in_place``: pairs of arguments that may share memory. Returns the argument an
    ``alias`` points at (else None)."""
    from hypothesis import assume
    from hypothesis import strategies as st
    name, kind = target
    free_dims = free_dims or {}
    assume(name in args and kind in corruption_kinds(args, name, outputs, free_dims=free_dims,
                                                     least_elements=least_elements, vectors=vectors, blocks=blocks,
                                                     free_last_stride=free_last_stride))
    ptr, readonly = _cai(args[name])["data"]
    shape, typestr, aliased = list(_cai(args[name])["shape"]), _cai(args[name])["typestr"], None
    strides = list(contiguous(shape))
    if kind == "dtype":
        typestr = data.draw(st.sampled_from(sorted({"<f2", "<f4", "<i4", "<i8"} - {typestr,
                                                                                   *(dtypes or {}).get(name, ())})))
    elif kind == "dim":
        dim = data.draw(st.sampled_from([d for d in range(len(shape)) if d not in free_dims.get(name, ())]))
        shape[dim] += data.draw(st.sampled_from([-1, 1] if shape[dim] else [1]))
        strides = list(contiguous(shape))
    elif kind == "rank":
        shape, strides = shape + [1], strides + [1]
    elif kind == "readonly":
        readonly = True
    elif kind == "null":
        ptr = 0
    elif kind in ("misaligned", "unaligned"):
        ptr += 1 if kind == "misaligned" else int(typestr[2:])
    elif kind == "padded":
        outer = next(d for d in range(len(shape)) if shape[d] > 1 or d == len(shape) - 1)
        strides[outer] += 1
    elif kind == "strided":
        strides = [2 * s for s in strides]
    elif kind == "gapped":
        strides = list(contiguous(shape[:-1] + [shape[-1] + 16 // int(typestr[2:])]))
    elif kind == "alias":
        others = [k for k in _arrays(args, nonempty=True) if k != name and {k, name} not in map(set, in_place)]
        aliased = data.draw(st.sampled_from(others), label="aliased")
        ptr = _cai(args[aliased])["data"][0]
    elif kind == "broadcast":
        strides[data.draw(st.sampled_from([d for d in range(len(shape)) if shape[d] > 1]), label="dim")] = 0
    elif kind == "short":
        shape, strides = [least_elements[name] - 1], [1]
    itemsize = int(typestr[2:])
    args[name] = FakeCAI(ptr, shape, typestr, tuple(s * itemsize for s in strides), readonly=readonly)
    return aliased


def expect_corrupted_call_refused(family: str, args: dict, target: tuple, aliased) -> None:
    """``launch(family, **args)``, made wrong by :func:`corrupt_one_argument`, is a typed refusal naming one of the
    call's arguments: the one made wrong where nothing else can be (an alias: either of the pair); a wrong dtype, dim
    or rank may be named by another argument that must match it. (Use with the ``no_driver`` fixture.)"""
    with pytest.raises(errors.InvalidArgumentError) as info:
        dispatch.launch(family, stream=0, **args)
    assert info.value.argument in args
    name, kind = target
    if kind == "alias":
        assert info.value.argument in (name, aliased)
    elif kind not in ("dtype", "dim", "rank"):
        assert info.value.argument == name
    if kind == "unaligned":
        assert isinstance(info.value, errors.AlignmentError)


# -- DLPack ----------------------------------------------------------------------------------------------
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject *), object not touched
_NAMES = {False: ctypes.c_char_p(b"dltensor"), True: ctypes.c_char_p(b"dltensor_versioned")}  # must outlive capsules


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class FakeDLPack:
    """An array exposing only ``__dlpack__``/``__dlpack_device__``, with a hand-built capsule.

    ``destroyed`` counts capsule destructor calls (to check nothing leaks or is freed twice);
    ``requests`` records the ``__dlpack__`` keyword arguments.
    """

    def __init__(self, ptr, shape, *, code=2, bits=32, lanes=1, strides=None, byte_offset=0, device=(2, 0),
                 versioned=True, major=1, flags=0, old_producer=False):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), strides
        self.code, self.bits, self.lanes, self.byte_offset, self.device = code, bits, lanes, byte_offset, device
        self.versioned, self.major, self.flags, self.old_producer = versioned, major, flags, old_producer
        self.destroyed = 0
        self.requests = []
        self._keep = []

        @CAPSULE_DESTRUCTOR
        def _destructor(_capsule):
            self.destroyed += 1

        self._destructor = _destructor

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, **extra):
        if self.old_producer and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.requests.append({"stream": stream, "max_version": max_version})
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = (ctypes.c_int64 * len(self.shape))(*self.strides) if self.strides is not None else None
        strides_ptr = ctypes.addressof(strides) if strides is not None else None
        tensor = _DLTensor(self.ptr, self.device[0], self.device[1], len(self.shape), self.code, self.bits,
                           self.lanes, ctypes.addressof(shape), strides_ptr, self.byte_offset)
        versioned = self.versioned and max_version is not None
        managed = _ManagedVersioned(self.major, 0, None, None, self.flags, tensor) if versioned else _Managed(tensor)
        self._keep += [shape, strides, managed]
        return _PyCapsule_New(ctypes.addressof(managed), _NAMES[versioned], ctypes.cast(self._destructor,
                                                                                          ctypes.c_void_p))


# -- cubins and manifests --------------------------------------------------------------------------------
class OnlyDLPack:
    """Wraps a framework array so that only the DLPack protocol is visible (no torch fast path, no CAI)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class OnlyCAI:
    """Wraps a framework array so that only ``__cuda_array_interface__`` is visible (as CuPy and Numba arrays
    present themselves)."""

    def __init__(self, array):
        self.array = array

    @property
    def __cuda_array_interface__(self):
        return self.array.__cuda_array_interface__


def variant_entry(family, constants, image, *, params, block=(256, 1, 1), cluster=(1, 1, 1), dynamic_smem=32,
                  grid="chunks,batch,heads/16"):
    stem = ".".join([family] + [f"{k}-{constants[k]}" for k in sorted(constants)])
    return {
        "family": family, "key": f"{family}[" + ",".join(f"{k}={constants[k]}" for k in sorted(constants)) + "]",
        "constants": constants, "file": f"cubins/{stem}.cubin", "sha256": hashlib.sha256(image).hexdigest(),
        "size": len(image), "kernel": f"kernel_{stem}", "block": list(block), "cluster": list(cluster),
        "dynamic_smem": dynamic_smem, "static_smem": 0, "registers": 24, "grid": grid, "params": params,
        "validated": True,
    }


def write_cubin_dir(root: Path, *, cc=(9, 0), version=None, chunk_sizes=(64, 256), dtypes=("bf16", "fp32"),
                    schema=1, **variant_options) -> Path:
    """Write ``root/mamba2_aot_cubins_smXY/{manifest.json, cubins/*.cubin}``; returns the package dir."""
    package = f"mamba2_aot_cubins_sm{cc[0]}{cc[1]}"
    pkg = root / package
    (pkg / "cubins").mkdir(parents=True)
    params = c_layout(ChunkCumsumPlan.param_names, CUMSUM_KINDS)
    variants = []
    for q in chunk_sizes:
        for dt in dtypes:
            constants = {"chunk_size": q, "dt_dtype": dt}
            image = f"fake cubin {package} {q} {dt}".encode()
            entry = variant_entry("ssd_chunk_cumsum", constants, image, params=params, **variant_options)
            (pkg / entry["file"]).write_bytes(image)
            variants.append(entry)
    data = {"schema": schema, "package": package, "version": version or mamba2_aot.__version__,
            "arch": f"sm_{cc[0]}{cc[1]}" + ("" if cc[0] == 8 else "a"), "compute_capability": list(cc),
            "toolchain": {"cutlass_dsl": "4.8.1", "cuda_flavour": "cu12"}, "variants": variants}
    (pkg / "manifest.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    return pkg


def mark_unvalidated(pkg: Path, chunk_size: int, experiments=("bwd_products_ahead",)) -> None:
    """Mark the variants of ``pkg`` (a :func:`write_cubin_dir`) with ``chunk_size`` as a build experiment makes them:
    ``"validated": false`` and, when ``experiments`` is not empty, ``"experiments"``."""
    data = json.loads((pkg / "manifest.json").read_text())
    for row in data["variants"]:
        if row["constants"]["chunk_size"] == chunk_size:
            row.update(validated=False, **({"experiments": list(experiments)} if experiments else {}))
    (pkg / "manifest.json").write_text(json.dumps(data, indent=1, sort_keys=True))


# -- driver ----------------------------------------------------------------------------------------------
class FakeDriver:
    """Records calls; devices have ``capabilities[i]``; pointers below ``device_split`` are on cuda:0."""

    def __init__(self, capabilities=((9, 0),), *, capturing=False, param_table=None, get_kernel_error=None):
        self.capabilities = list(capabilities)
        self.capturing = capturing
        self.param_table = param_table
        self.get_kernel_error = get_kernel_error
        self.calls = []
        self.launches = []
        self.device_split = 1 << 40
        self.current = 0
        self.stream_contexts = {}
        self.param_sizes = [row["size"] for row in c_layout(ChunkCumsumPlan.param_names, CUMSUM_KINDS)]

    def _record(self, *call):
        self.calls.append(call)

    version_string = "13.0"

    def device_count(self):
        return len(self.capabilities)

    def compute_capability(self, device):
        return self.capabilities[device]

    def device_attribute(self, attribute, device):
        self._record("device_attribute", attribute, device)
        return 227 * 1024

    def device_name(self, device):
        return "Fake GPU"

    def primary_context(self, device):
        return 0x1000 + device

    def bind_primary_context(self, device):
        self._record("bind", device)
        previous, self.current = self.current, self.primary_context(device)
        return previous if previous not in (0, self.current) else None

    def set_current_context(self, ctx):
        self._record("set_current", ctx)
        self.current = ctx

    def pointer_device(self, ptr):
        self._record("pointer_device", ptr)
        return 0 if ptr < self.device_split else 1

    def stream_context(self, stream):
        return self.stream_contexts.get(stream, 0x1000)

    def stream_is_capturing(self, stream):
        self._record("is_capturing", stream)
        return self.capturing

    def stream_wait_stream(self, consumer, producer):
        self._record("wait", consumer, producer)

    def library_load_data(self, image):
        self._record("load", image)
        return 0xAAAA

    def library_get_kernel(self, library, symbol):
        self._record("get_kernel", symbol)
        if self.get_kernel_error is not None:
            raise self.get_kernel_error
        return 0xBBBB

    def kernel_param_info(self, kernel, count):
        return None if self.param_table is None else self.param_table[:count]

    def kernel_attribute(self, attribute, kernel, device):
        return 1024

    def set_kernel_attribute(self, attribute, value, kernel, device):
        self._record("set_attribute", attribute, value, device)

    def kernel_function(self, kernel):
        self._record("function", self.current)
        return 0xCCCC

    def memset_d32(self, ptr, value, count, stream):
        self._record("memset_d32", ptr, value, count, stream)

    def launch(self, func, grid, block, smem, stream, attrs, num_attrs, params):
        self.launches.append({
            "func": func, "grid": tuple(grid), "block": tuple(block), "smem": smem, "stream": stream,
            "attrs": [tuple(attrs[i].value.clusterDim) for i in range(num_attrs)],
            # copy the packed values now: the runtime frees its parameter buffer when launch returns
            "params": [ctypes.string_at(params[i], size) for i, size in enumerate(self.param_sizes)],
            "context": self.current,
        })


def unpack_params(launch_record, layout):
    """Decode the packed kernel params of a recorded launch by the manifest layout -> {name: value}."""
    codes = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}
    values = {}
    for row, raw in zip(layout, launch_record["params"]):
        values[row["name"]] = struct.unpack(codes[row["kind"]], raw)[0]
    return values


def reset_runtime_state(monkeypatch):
    """Fresh caches: no catalog, no driver, nothing loaded; unvalidated variants not allowed."""
    monkeypatch.delenv(manifest.ENV_ALLOW_UNVALIDATED, raising=False)
    monkeypatch.setattr(manifest, "_catalog", None)
    monkeypatch.setattr(driver, "_driver", None)
    monkeypatch.setattr(dispatch, "_kernels", {})
    monkeypatch.setattr(dispatch, "_libraries", {})
    monkeypatch.setattr(dispatch, "_recent_calls", {})


@pytest.fixture
def no_driver(monkeypatch):
    """Any attempt to open libcuda fails the test: proves a refused call never reaches the driver."""
    reset_runtime_state(monkeypatch)

    def explode():
        raise AssertionError("the CUDA driver was opened")

    monkeypatch.setattr(driver, "_load_library", explode)


def expect_valid_call(family, kwargs):
    """``launch(family, **kwargs)`` passes validation: it gets as far as the variant lookup or the driver (use with
    the ``no_driver`` fixture)."""
    try:
        dispatch.launch(family, stream=0, **kwargs)
    except errors.VariantNotFoundError:
        return
    except AssertionError as exc:
        if "the CUDA driver was opened" in str(exc):
            return
        raise
    raise AssertionError(f"{family} launched without a driver")


def expect_refused(family, kwargs, error, argument, fragment):
    """``launch(family, **kwargs)`` raises ``error`` naming ``argument``, its message holding ``fragment`` (use
    with the ``no_driver`` fixture: the refusal happens before the driver is opened)."""
    with pytest.raises(error) as info:
        dispatch.launch(family, stream=0, **kwargs)
    assert info.value.argument == argument
    assert fragment in str(info.value)


@pytest.fixture
def fake_runtime(tmp_path, monkeypatch):
    """Fake sm_90 cubins in MAMBA2_AOT_CUBIN_DIR and a FakeDriver with one sm_90 device; yields the driver."""
    reset_runtime_state(monkeypatch)
    write_cubin_dir(tmp_path)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))
    monkeypatch.delenv(manifest.ENV_SKIP_SHA256, raising=False)
    fake = FakeDriver()
    monkeypatch.setattr(driver, "_driver", fake)
    return fake
