"""``launch``, ``preload``, ``workspace_size``, ``list_variants``: from a call to a kernel on a stream.

One ``launch`` call, in order (the driver is touched from step 4 on, so most bad calls never reach it):

1. find the family's plan (``plans.PLANS``);
2. resolve the stream (``streams``) and adapt the array arguments (``tensors``);
3. let the plan validate (``plans/<family>``) and apply the checks every kernel needs
   (``validation.check_call``), or reuse the result of an identical recent call; an empty grid
   returns here; otherwise constants that no installed manifest (of any arch) has are refused here;
4. establish the one device of all arrays and the stream, and make its primary context current;
5. take the loaded kernel for (family, constants, device) from a cache, or load it: variant lookup by
   the device's compute capability, sha256 check, ``cuLibraryLoadData`` once per cubin, per-device
   kernel attributes, parameter-table check (refused while the stream captures a CUDA graph);
6. pack the parameters at the manifest's offsets and ``cuLaunchKernelEx``.

The loaded-kernel cache is read without a lock (a dict lookup is atomic); loading holds a lock.
"""
from __future__ import annotations

import contextlib
import ctypes
import difflib
import inspect
import math
import struct
import threading
import warnings

from . import driver, manifest, streams
from .errors import (ArchMismatchError, CubinPackageError, CudaDriverError, DeviceError, GraphCaptureError,
                     InvalidArgumentError, ManifestError, Mamba2AOTError, VariantNotFoundError)
from .plans import PLANS, CompositePlan, LaunchPlan, StepPlan
from .tensors import as_device_array
from .validation import BoundCall, check_call

_STRUCT_CODES = {"ptr": "Q", "i32": "i", "i64": "q", "f32": "f"}
_DEFAULT_MAX_DYNAMIC_SMEM = 48 * 1024  # above this a kernel must opt in (cuKernelSetAttribute)
_PORTABLE_CLUSTER_SIZE = 8


class ParamPacker:
    """Packs parameter values by name at the manifest's offsets (built once per variant).

    :meth:`pack` turns the values into bytes; :meth:`load` copies bytes into this thread's buffer and
    returns the ``void*[]`` ``kernelParams`` array for ``cuLaunchKernelEx`` (one pointer into the buffer
    per parameter). Each thread has its own buffer, allocated on its first launch and reused afterwards:
    the driver copies the values during ``cuLaunchKernelEx``, so a buffer is free again when it returns.
    """

    def __init__(self, params: tuple[manifest.Param, ...]):
        fmt, end = ["<"], 0
        for p in params:
            fmt.append(f"{p.offset - end}x{_STRUCT_CODES[p.kind]}")
            end = p.offset + p.size
        self.struct = struct.Struct("".join(fmt))
        self.names = tuple(p.name for p in params)
        self.offsets = tuple(p.offset for p in params)
        self.size = max(end, 1)
        self._per_thread = threading.local()

    def _buffers(self):
        buffer = ctypes.create_string_buffer(self.size)
        base = ctypes.addressof(buffer)
        kernel_params = (ctypes.c_void_p * len(self.offsets))(*[base + offset for offset in self.offsets])
        self._per_thread.buffers = buffers = (buffer, kernel_params)
        return buffers

    def pack(self, values: dict) -> bytes:
        """The parameter bytes for ``values`` (every parameter name -> value)."""
        return self.struct.pack(*[values[name] for name in self.names])

    def load(self, packed: bytes):
        """Copy ``packed`` into this thread's buffer; returns its ``kernelParams`` array."""
        try:
            buffer, kernel_params = self._per_thread.buffers
        except AttributeError:
            buffer, kernel_params = self._buffers()
        ctypes.memmove(buffer, packed, len(packed))
        return kernel_params


class LoadedKernel:
    """A variant ready to launch on one device: its ``CUfunction`` plus precomputed launch settings."""

    __slots__ = ("variant", "device", "function", "block", "smem", "attrs", "num_attrs", "packer")

    def __init__(self, variant: manifest.Variant, device: int, function: int):
        self.variant = variant
        self.device = device
        self.function = function
        self.block = variant.block
        self.smem = variant.dynamic_smem
        self.attrs, self.num_attrs = driver.launch_attributes(variant.cluster)
        self.packer = ParamPacker(variant.params)

    def launch(self, drv, call: BoundCall, stream: int, packed_cache: dict | None) -> None:
        """Launch ``call`` on ``stream``; ``packed_cache`` (kernel -> bytes) keeps a memoised call's packed
        parameters, so a repeated call only copies them."""
        packed = packed_cache.get(self) if packed_cache is not None else None
        if packed is None:
            packed = self.packer.pack(call.params)
            if packed_cache is not None:
                packed_cache[self] = packed
        drv.launch(self.function, call.grid, self.block, self.smem, stream, self.attrs, self.num_attrs,
                   self.packer.load(packed))


_kernels: dict[tuple, LoadedKernel] = {}  # (family, constants_key, device) -> LoadedKernel
_libraries: dict[str, tuple[int, bytes]] = {}  # cubin path -> (CUlibrary, image kept alive for the process)
_load_lock = threading.RLock()
_recent_calls: dict[tuple, tuple] = {}  # see _validated
_RECENT_CALLS_MAX = 1024
_keywords: dict[LaunchPlan, tuple] = {}  # plan -> (accepted, required, takes **kwargs); see _keyword_error


def launchable_families() -> list[str]:
    """The families ``launch`` takes (not the steps that only run inside ssd_fwd or ssd_bwd), sorted."""
    return sorted(name for name, plan in PLANS.items() if not isinstance(plan, StepPlan))


def _plan(family: str, *, steps_too: bool = False) -> LaunchPlan:
    """``family``'s plan; VariantNotFoundError lists the names the caller takes (with ``steps_too``, the steps)."""
    plan = PLANS.get(family) if isinstance(family, str) else None
    if plan is None:
        known = f"families and steps: {', '.join(sorted(PLANS))}" if steps_too else \
            f"families: {', '.join(launchable_families())}"
        raise VariantNotFoundError(f"unknown kernel family {family!r}; known {known}")
    return plan


def launch(family: str, *, stream=None, **kwargs) -> None:
    """Launch ``family``'s kernel on ``stream`` (see ``streams`` for ``None``) with ``kwargs``.

    The keyword arguments are the family's (documented in ``mamba2_aot/plans/<family>.py``). Raises an
    :class:`~mamba2_aot.errors.InvalidArgumentError` subclass for a bad argument (itself for an unknown or
    missing keyword, listing the accepted ones), :class:`VariantNotFoundError` when the constants were not
    built for any installed arch (checked before the driver is opened) or not for the device's arch,
    :class:`CubinPackageError` for install problems, :class:`GraphCaptureError` when a kernel would have
    to be loaded during capture, and :class:`CudaDriverError`. A refused call launches nothing.
    """
    plan = _plan(family)
    handle = streams.resolve(stream, kwargs.values())
    dlpack_stream = streams.as_dlpack_stream(handle)
    try:
        for name in plan.arrays:
            obj = kwargs.get(name)
            if obj is not None:
                kwargs[name] = as_device_array(obj, name, dlpack_stream=dlpack_stream)
    except InvalidArgumentError:
        # a misspelt or missing keyword is the first thing to fix: named before an array that is not on the GPU
        error = _keyword_error(plan, kwargs)
        if error is None:
            raise
        raise error from None
    if isinstance(plan, CompositePlan):
        _launch_steps(plan, kwargs, handle)
        return
    call, variant_key, known_device, packed_cache = _validated(plan, kwargs)
    if 0 in call.grid:
        return  # an empty batch or no heads: nothing to compute
    drv = driver.get()
    device = _device_of(drv, call, handle, known_device)
    kernel = _kernels.get((family, variant_key, device)) or _load(drv, plan, call, device, handle)
    _enqueue(drv, device, kernel, call, handle, packed_cache)


@contextlib.contextmanager
def _primary_context(drv, device: int):
    """The device's primary context current inside the block; the thread's own context back afterwards. Needed
    before anything stream-related: on a thread with no context, the legacy stream (0) means nothing until then."""
    restore = drv.bind_primary_context(device)
    try:
        yield
    finally:
        if restore is not None:
            drv.set_current_context(restore)


def _load(drv, plan: LaunchPlan, call: BoundCall, device: int, handle: int) -> LoadedKernel:
    """``load_kernel`` for a launch on ``handle`` (whose capture status it asks)."""
    with _primary_context(drv, device):
        return load_kernel(drv, plan, call.constants, device, capture_stream=handle)


def _enqueue(drv, device: int, kernel: LoadedKernel, call: BoundCall, handle: int, packed_cache: dict | None) -> None:
    # _primary_context written out: on the launch path the context manager's generator costs ~1.3 µs a call
    restore = drv.bind_primary_context(device)
    try:
        _wait_for_producers(drv, call, handle)
        for words in call.zeroed:
            drv.memset_d32(words.ptr, 0, math.prod(words.shape), handle)
        kernel.launch(drv, call, handle, packed_cache)
    finally:
        if restore is not None:
            drv.set_current_context(restore)


def _launch_steps(plan: CompositePlan, kwargs: dict, handle: int) -> None:
    """A composite family: validate and check every step (and that each is built), find the one device of all their
    arrays and load every step's kernel on it, then launch them in order (so a refused call launches nothing)."""
    bound, every_array, known_device, packed_caches = _validated_steps(plan, kwargs)
    if not bound:
        return
    drv = driver.get()
    device = _device_of(drv, every_array, handle, known_device)
    kernels = [_kernels.get((step_plan.family, variant_key, device)) or _load(drv, step_plan, call, device, handle)
               for step_plan, call, variant_key in bound]
    for kernel, (_, call, _), packed_cache in zip(kernels, bound, packed_caches):
        _enqueue(drv, device, kernel, call, handle, packed_cache)


def _validated_steps(plan: CompositePlan, kwargs: dict) -> tuple[list, BoundCall, int | None, list]:
    """``plan.steps`` with every step checked, remembered for repeated identical calls like :func:`_validated`.
    Returns the non-empty steps as (step plan, call, variant key), one call holding every array of the steps (for
    the device check), their device when every array names it, and each step's cache of packed parameters (one
    per step: two steps may launch the same kernel)."""
    def validate(memoisable: bool):
        bound = []
        for family, call in _call_plan(plan.steps, plan, kwargs):
            variant_key = _checked(family, call)
            if 0 not in call.grid:
                bound.append((PLANS[family], call, variant_key))
        arrays = tuple(a for _, call, _ in bound for a in call.inputs + call.outputs)
        return (bound, BoundCall({}, (1, 1, 1), {}, arrays, ()), _one_device(arrays),
                [{} if memoisable else None for _ in bound])
    return _remembered(plan, kwargs, validate)


def _validated(plan: LaunchPlan, kwargs: dict) -> tuple[BoundCall, tuple, int | None, dict | None]:
    """``plan.bind`` + ``check_call``, remembered for repeated identical calls.

    Returns the call, its variant's lookup key, the arrays' device when every array names it (torch,
    DLPack; ``None`` when a ``__cuda_array_interface__`` array leaves it to the driver) and the memo's
    cache of packed parameters (``None`` when the call could not be memoised). Validation is a
    pure function of the adapted arguments (pointers, shapes, strides, dtypes, devices, options), so a call
    identical to a recent one reuses its result: serving loops that launch on the same buffers skip most
    of the host work. Unhashable arguments (e.g. a list) just skip the memo. A non-empty call whose
    constants no installed manifest has raises :class:`VariantNotFoundError` (checked on a memo miss only).
    """
    def validate(memoisable: bool):
        call = _call_plan(plan.bind, plan, kwargs)
        return (call, _checked(plan.family, call), _one_device(call.inputs + call.outputs),
                {} if memoisable else None)
    return _remembered(plan, kwargs, validate)


def _remembered(plan: LaunchPlan, kwargs: dict, validate):
    """``validate(memoisable)`` for this call, or its result for an identical recent call (see :func:`_validated`)."""
    # the values' types too: 1.0 == True and 256.0 == 256, which validation refuses where it takes a bool / an int
    key = (plan.family, *kwargs.items(), *map(type, kwargs.values()))
    try:
        memo = _recent_calls.get(key)
    except TypeError:
        key, memo = None, None
    if memo is None:
        memo = validate(key is not None)
        if key is not None:
            if len(_recent_calls) >= _RECENT_CALLS_MAX:
                _recent_calls.clear()
            _recent_calls[key] = memo
    return memo


def _one_device(arrays) -> int | None:
    """The arrays' device when they all name the same one, else None."""
    devices = {a.device for a in arrays}
    return devices.pop() if len(devices) == 1 else None


def _call_plan(fn, plan: LaunchPlan, kwargs: dict):
    """``fn(**kwargs)`` (the plan's ``bind``, or a composite's ``steps``), a misspelt or missing keyword raised as
    :class:`InvalidArgumentError`."""
    try:
        return fn(**kwargs)
    except TypeError as exc:  # only the error path pays for inspecting the signature
        error = None if isinstance(exc, Mamba2AOTError) else _keyword_error(plan, kwargs)
        if error is None:
            raise
        raise error from None


def _checked(family: str, call: BoundCall) -> tuple:
    """The checks every kernel call needs (``check_call``) and, unless its grid is empty, that its variant is built;
    returns the variant's lookup key."""
    check_call(call)
    variant_key = manifest.constants_key(call.constants)
    if 0 not in call.grid:
        manifest.catalog().require_built(family, variant_key)
    return variant_key


def _keyword_error(plan: LaunchPlan, kwargs: dict, *, required: bool = True) -> InvalidArgumentError | None:
    """The :class:`InvalidArgumentError` for a keyword ``plan.bind`` does not take (or, with ``required``, a
    required one not given), listing the accepted keywords; ``None`` when the keywords are fine (the ``TypeError``
    came from elsewhere). The signature is read once per plan, and only on error paths and ``workspace_size``."""
    entry = _keywords.get(plan)
    if entry is None:
        # a composite's steps may take some keywords and pass the rest (**kwargs) to its bind: both signatures count
        signatures = [inspect.signature(fn).parameters.values()
                      for fn in ((plan.steps, plan.bind) if isinstance(plan, CompositePlan) else (plan.bind,))]
        named = {p.name: p for params in signatures for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                   p.KEYWORD_ONLY)}
        entry = _keywords[plan] = (tuple(named), tuple(n for n, p in named.items() if p.default is p.empty),
                                   all(any(p.kind == p.VAR_KEYWORD for p in params) for params in signatures))
    accepted, needed, open_ended = entry
    accepts = f"{plan.family} accepts: {', '.join(accepted)}, stream"
    unknown = [] if open_ended else [name for name in kwargs if name not in accepted]
    if unknown:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if len(unknown) == 1 and close else ""
        return InvalidArgumentError(unknown[0] if len(unknown) == 1 else None,
                                    f"{', '.join(unknown)}: not an argument of {plan.family}{hint}; {accepts}")
    missing = [name for name in needed if name not in kwargs] if required else []
    if missing:
        return InvalidArgumentError(missing[0] if len(missing) == 1 else None,
                                    f"{', '.join(missing)}: required by {plan.family}; {accepts}")
    return None


def _device_of(drv, call: BoundCall, stream: int, known_device: int | None) -> int:
    """The one CUDA device of every array and the stream; :class:`DeviceError` naming the odd one out.

    ``known_device``: the arrays' common device when they all name one (then only the stream is checked).
    """
    device = known_device
    if device is None:
        first = None
        for a in call.inputs + call.outputs:
            d = a.device
            if d is None:  # __cuda_array_interface__: ask the driver who owns the pointer
                if a.size == 0:
                    continue  # never dereferenced; its pointer may not even be valid
                d = drv.pointer_device(a.ptr)
            if device is None:
                device, first = d, a.name
            elif d != device:
                raise DeviceError(a.name, f"{a.name} is on cuda:{d} but {first} is on cuda:{device}; every tensor "
                                  "and the stream must be on one device")
    if stream not in driver.SPECIAL_STREAMS and drv.stream_context(stream) != drv.primary_context(device):
        raise DeviceError("stream", f"stream: {stream:#x} does not belong to cuda:{device} (the tensors' device) or "
                          "is not in its primary context")
    return device


def _wait_for_producers(drv, call: BoundCall, stream: int) -> None:
    """Order the launch after producer streams named by ``__cuda_array_interface__`` v3 exports."""
    launch_stream = driver.CU_STREAM_LEGACY if stream == 0 else stream
    for producer in {a.stream for a in call.inputs + call.outputs if a.stream}:
        if producer != launch_stream:
            drv.stream_wait_stream(stream, producer)


def load_kernel(drv, plan: LaunchPlan, constants: dict, device: int, *,
                capture_stream: int | None = None) -> LoadedKernel:
    """Load (once) the variant of ``plan`` with ``constants`` for ``device``. Thread-safe.

    ``capture_stream``: the stream the caller will launch on; if it is capturing a CUDA graph, a cold
    kernel is refused (loading inside capture fails or breaks the capture).
    """
    cc = drv.compute_capability(device)
    variant = manifest.catalog().find(plan.family, constants, cc)
    key = (plan.family, manifest.constants_key(constants), device)
    with _load_lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
        if capture_stream is not None and drv.stream_is_capturing(capture_stream):
            raise GraphCaptureError(
                f"{variant.key} is not loaded on cuda:{device} and the stream is capturing a CUDA graph; call "
                "mamba2_aot.preload() (optionally with the families you use) before capturing"
            )
        kernel = _kernels[key] = _load_variant(drv, plan, variant, device)
        return kernel


def _load_variant(drv, plan: LaunchPlan, variant: manifest.Variant, device: int) -> LoadedKernel:
    names = tuple(p.name for p in variant.params)
    if names != plan.param_names or variant.grid != plan.grid_rule:
        raise ManifestError(
            f"{variant.key} in {variant.manifest.path}: params {names} / grid {variant.grid!r} do not match this "
            f"runtime's plan ({plan.param_names} / {plan.grid_rule!r}); install matching versions of mamba2_aot and "
            f"{variant.manifest.package}"
        )
    library = _library(drv, variant)
    with _primary_context(drv, device):
        try:
            kernel = drv.library_get_kernel(library, variant.kernel)
            _check_param_table(drv, kernel, variant)
            _set_kernel_attributes(drv, kernel, variant, device)
            function = drv.kernel_function(kernel)
        except CudaDriverError as exc:
            if exc.code == driver.CUDA_ERROR_NO_BINARY_FOR_GPU:
                cc = drv.compute_capability(device)
                arch = manifest.arch_name(cc)
                raise ArchMismatchError(
                    f"{variant.key} from {variant.manifest.package} was built for {variant.manifest.arch} and does "
                    f"not run on cuda:{device} ({arch}); install the cubins for {arch}: {manifest.install_hint(cc)}"
                ) from exc
            raise
    return LoadedKernel(variant, device, function)


def _library(drv, variant: manifest.Variant) -> int:
    """``cuLibraryLoadData`` once per cubin per process (after the sha256 check); never unloaded."""
    key = str(variant.path)
    entry = _libraries.get(key)
    if entry is None:
        image = manifest.read_cubin(variant)
        # The image is kept referenced for the life of the process: with lazy loading the driver may
        # read it after cuLibraryLoadData returns.
        entry = _libraries[key] = (drv.library_load_data(image), image)
    return entry[0]


def _check_param_table(drv, kernel: int, variant: manifest.Variant) -> None:
    expected = [(p.offset, p.size) for p in variant.params]
    table = drv.kernel_param_info(kernel, len(expected))
    if table is None:  # driver older than CUDA 12.4: the build already checked the cubin's whole table
        return
    if table != expected:
        raise ManifestError(f"{variant.key}: the cubin's parameter table {table} disagrees with the manifest's "
                            f"{expected}; reinstall {variant.manifest.package}")


def _set_kernel_attributes(drv, kernel: int, variant: manifest.Variant, device: int) -> None:
    static = drv.kernel_attribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel, device)
    limit = drv.device_attribute(driver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)
    if static + variant.dynamic_smem > limit:
        raise CubinPackageError(f"{variant.key} needs {static} + {variant.dynamic_smem} bytes of shared memory; "
                                f"cuda:{device} offers {limit} per block")
    if variant.dynamic_smem > _DEFAULT_MAX_DYNAMIC_SMEM:
        drv.set_kernel_attribute(driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, variant.dynamic_smem,
                                 kernel, device)
    cx, cy, cz = variant.cluster
    if cx * cy * cz > _PORTABLE_CLUSTER_SIZE:
        drv.set_kernel_attribute(driver.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kernel, device)


def preload(families=None, devices=None) -> list[tuple[str, int]]:
    """Load every built variant (of ``families``: a family name or several, default all) on ``devices`` (a
    device ordinal or several; default: every visible device with cubins for its arch), so launches under
    CUDA-graph capture need no loading.

    Returns ``[(variant key, device)]`` loaded. Raises :class:`VariantNotFoundError` for an unknown
    family name, :class:`CubinPackageError` when a named device (or, by default, every device) has no
    cubins, and :class:`CudaDriverError`.
    """
    if families is not None:
        families = [families] if isinstance(families, str) else list(families)
        families = [step for family in families for step in _kernel_families(family)]
    drv = driver.get()
    explicit = devices is not None
    devices = [devices] if isinstance(devices, int) else list(devices) if explicit else range(drv.device_count())
    catalog = manifest.catalog()
    loaded, first_error = [], None
    for device in devices:
        try:
            table = catalog.index(drv.compute_capability(device))
        except CubinPackageError as exc:
            if explicit:
                raise
            first_error = first_error or exc
            continue
        for (family, _), variant in sorted(table.items(), key=lambda item: item[1].key):
            if family in PLANS and (families is None or family in families):
                load_kernel(drv, PLANS[family], dict(variant.constants), device)
                loaded.append((variant.key, device))
    if first_error is not None and not loaded:
        raise first_error
    return loaded


def workspace_size(family: str, *, stream=None, **kwargs) -> int:
    """Bytes of caller-owned workspace ``launch(family, ...)`` needs for these arguments (0 if none).

    Takes any of the launch's keyword arguments (``ssd_fwd`` and ``ssd_bwd`` need x and B; ``stream`` is ignored)
    and checks those it reads as the launch would. Raises :class:`VariantNotFoundError` for an unknown family,
    :class:`InvalidArgumentError` for a keyword the launch does not take, and its subclasses for a bad x or B."""
    plan = _plan(family)
    error = _keyword_error(plan, kwargs, required=False)
    if error is not None:
        raise error
    return plan.workspace_size(**kwargs)


def _kernel_families(family: str) -> tuple[str, ...]:
    """The families whose kernels a launch of ``family`` runs (a composite's steps; else itself). Raises
    VariantNotFoundError for an unknown family."""
    plan = _plan(family, steps_too=True)
    return plan.step_families if isinstance(plan, CompositePlan) else (family,)


def list_variants(family: str | None = None) -> list[dict]:
    """Every variant in the installed cubins (no GPU needed): family, key, constants, arch,
    compute_capability, package, validated, experiments (the build experiments it was compiled with), usable
    (False for an unvalidated one without MAMBA2_AOT_ALLOW_UNVALIDATED=1). ``family`` filters (a composite family:
    its steps' variants; an unknown one raises :class:`VariantNotFoundError`, as in ``launch``). A cubin source that
    could not be read (a ``MAMBA2_AOT_CUBIN_DIR`` with no manifest, a broken wheel) raises its
    :class:`CubinPackageError` when no other source was read, else is a RuntimeWarning (``python -m mamba2_aot
    list`` prints them all)."""
    wanted = None if family is None else _kernel_families(family)
    rows = []
    catalog = manifest.catalog()
    if catalog.problems and not catalog.manifests:
        raise catalog.problems[0].error.with_traceback(None)   # (one stored error: its traceback would grow)
    for problem in catalog.problems:
        warnings.warn(f"mamba2_aot cubins at {problem.where} not read: {problem.error}", RuntimeWarning, stacklevel=2)
    for m in catalog.manifests:
        for v in m.variants:
            if wanted is None or v.family in wanted:
                rows.append({"family": v.family, "key": v.key, "constants": dict(v.constants), "arch": m.arch,
                             "compute_capability": m.compute_capability, "package": m.package,
                             "validated": v.validated, "experiments": list(v.experiments),
                             "usable": catalog.usable(v)})
    return rows
