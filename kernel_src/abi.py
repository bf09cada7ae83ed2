"""The flat kernel ABI shared by every family: parameter declarations and compile-time placeholders.

A kernel parameter is a raw device pointer (``ptr``), a 32/64-bit integer (``i32``/``i64``) or an fp32
scalar (``f32``). Families declare their parameters once, as a list of :class:`Param`; that one list
feeds the placeholder arguments of ``cute.compile``, the manifest, the build's check against the cubin's
own parameter table, and (through the manifest) the runtime's argument packing.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

# C sizes (and natural alignments) of each kind, as the cubin's KPARAM table reports them.
KIND_SIZES = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4}

# The element types a pointer parameter may point to, by the names used in variants and manifests.
DTYPE_NAMES = ("bf16", "fp16", "fp32", "int32", "int64")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``name`` (the runtime packs by it), ``kind`` and, for pointers, ``dtype`` and the
    byte alignment the kernel may assume (``align``; default: the element size)."""

    name: str
    kind: str
    dtype: str | None = None
    align: int | None = None

    def __post_init__(self):
        if self.kind not in KIND_SIZES:
            raise ValueError(f"param {self.name!r}: unknown kind {self.kind!r}")
        if (self.kind == "ptr") != (self.dtype is not None):
            raise ValueError(f"param {self.name!r}: a dtype is given for pointers and only for them")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"param {self.name!r}: unknown dtype {self.dtype!r}")


def ptr(name: str, dtype: str, align: int | None = None) -> Param:
    return Param(name, "ptr", dtype, align)


def i32(name: str) -> Param:
    return Param(name, "i32")


def i64(name: str) -> Param:
    return Param(name, "i64")


def f32(name: str) -> Param:
    return Param(name, "f32")


def strides(array: str, *dims: str) -> list[Param]:
    """The int64 element strides of ``array`` the kernel takes, named ``stride_<array>_<dim>`` (the runtime's
    ``validation.record_strides`` fills them by the same rule); a dim left out is contiguous or implied."""
    return [i64(f"stride_{array}_{d}") for d in dims]


def ssm_input_strides() -> list[Param]:
    """The strides of the SSM inputs every SSM family takes, in kernel order: x, dt, A, B, C, D, z, dt_bias, each
    (batch, seqlen, head | group)-indexed with its last dim contiguous."""
    return [*strides("x", "batch", "seqlen", "head"), *strides("dt", "batch", "seqlen", "head"), *strides("A", "head"),
            *strides("B", "batch", "seqlen", "group"), *strides("C", "batch", "seqlen", "group"),
            *strides("D", "head", "dim"), *strides("z", "batch", "seqlen", "head"), *strides("dt_bias", "head")]


def ssm_strides() -> list[Param]:
    """:func:`ssm_input_strides` and the output's, ``out`` (batch, seqlen, head): the forward families'."""
    return [*ssm_input_strides(), *strides("out", "batch", "seqlen", "head")]


def layout(params: list[Param]) -> list[dict]:
    """The C layout of a parameter list: ``[{"name", "kind", "size", "offset"}]`` with natural alignment."""
    offset = 0
    rows = []
    for p in params:
        size = KIND_SIZES[p.kind]
        offset = (offset + size - 1) // size * size
        rows.append({"name": p.name, "kind": p.kind, "size": size, "offset": offset})
        offset += size
    return rows


def bind(params: list[Param], values: tuple) -> SimpleNamespace:
    """Name the flat argument tuple a kernel receives (``args.nheads``, ``args.stride_x_batch``, ...).

    Kernels take their parameters as one tuple, which the DSL flattens into separate kernel parameters in
    order; binding the names at trace time keeps the declaration in :meth:`params` the only list of them.
    """
    if len(values) != len(params):
        raise ValueError(f"{len(values)} kernel arguments for {len(params)} declared params")
    return SimpleNamespace(**{p.name: v for p, v in zip(params, values)})


def cutlass_dtype(name: str):
    """The CuTe DSL numeric type for a dtype name (imports the DSL: build side only)."""
    import cutlass

    return {
        "bf16": cutlass.BFloat16,
        "fp16": cutlass.Float16,
        "fp32": cutlass.Float32,
        "int32": cutlass.Int32,
        "int64": cutlass.Int64,
    }[name]


def placeholder(p: Param):
    """A compile-time stand-in for one parameter (the value is irrelevant, its type is the ABI)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    if p.kind == "ptr":
        element = cutlass_dtype(p.dtype)
        # By default only element alignment is assumed: strided views of larger buffers are legal inputs.
        align = p.align or element.width // 8
        return make_ptr(element, align, cute.AddressSpace.gmem, assumed_align=align)
    return {"i32": cutlass.Int32(0), "i64": cutlass.Int64(0), "f32": cutlass.Float32(0.0)}[p.kind]
