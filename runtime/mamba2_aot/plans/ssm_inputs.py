"""The SSM inputs and output every SSM family takes (BRIEF §2): x, dt, A, B, C, out and the optional D, z,
dt_bias. Their stride parameters in kernel order, and one validation of them for every launch plan."""
from __future__ import annotations

from typing import NamedTuple

from ..errors import ShapeError
from ..validation import expect_dtype, expect_rank, expect_shape, null_absent, record_strides, stride_names

# The kernels' abi.ssm_input_strides() and abi.ssm_strides(), name for name.
SSM_INPUT_STRIDES = (stride_names("x", "batch", "seqlen", "head") + stride_names("dt", "batch", "seqlen", "head")
                     + stride_names("A", "head") + stride_names("B", "batch", "seqlen", "group")
                     + stride_names("C", "batch", "seqlen", "group") + stride_names("D", "head", "dim")
                     + stride_names("z", "batch", "seqlen", "head") + stride_names("dt_bias", "head"))
SSM_STRIDES = SSM_INPUT_STRIDES + stride_names("out", "batch", "seqlen", "head")


class SsmShape(NamedTuple):
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    d_state: int


def x_shape(x, io_dtypes: tuple[str, ...], length: str) -> tuple[int, int, int, int]:
    """x (batch, length, H, P) in one of ``io_dtypes``; ``length`` names dim 1 in messages ("T", "seqlen").
    Checked first, so that a plan can check its own rules on x's shape before the rest."""
    expect_dtype(x, io_dtypes)
    expect_rank(x, 4, f"(batch, {length}, nheads, headdim)")
    return x.shape


def bind_ssm_inputs(params: dict, *, x, dt, A, B, C, out, D, z, dt_bias, length: str) -> tuple[SsmShape, list]:
    """Check the SSM arrays against x (already checked by :func:`x_shape`) and record their pointers, strides
    and ``has_*`` flags (an absent optional array: null pointer, zero strides).

    B, C (batch, length, G, N) in x's dtype, G dividing H, last dim contiguous; the rest as in
    :func:`bind_ssm_gates`. Returns the shape and the arrays read, in order.
    """
    batch, seqlen, nheads, headdim = x.shape
    read = bind_ssm_gates(params, x.shape, x.dtype, dt=dt, A=A, out=out, D=D, z=z, dt_bias=dt_bias, length=length)
    ngroups = expect_groups(B, nheads, length)
    d_state = B.shape[3]
    for m in (B, C):
        expect_ssm_operand(m, x, ngroups, length, d_state)
    params.update(x=x.ptr, B=B.ptr, C=C.ptr, heads_per_group=nheads // ngroups)
    for arr, dims in ((x, ("batch", "seqlen", "head")), (B, ("batch", "seqlen", "group")),
                      (C, ("batch", "seqlen", "group"))):
        record_strides(params, arr, dims)
    return SsmShape(batch, seqlen, nheads, headdim, ngroups, d_state), [x, B, C] + read


def expect_ssm_operand(m, x, ngroups: int, length: str, d_state: int | None = None) -> None:
    """B or C: (batch, length, ngroups, d_state) of x (d_state: B's, or ``m``'s own when not given), x's dtype."""
    expect_dtype(m, (x.dtype,))
    expect_shape(m, (*x.shape[:2], ngroups, m.shape[3] if d_state is None else d_state),
                 f"(batch, {length}, ngroups, d_state) of x")


def expect_groups(B, nheads: int, length: str = "seqlen") -> int:
    """B's rank and its ngroups (dim 2), which must divide nheads; returns ngroups."""
    expect_rank(B, 4, f"(batch, {length}, ngroups, d_state)")
    ngroups = B.shape[2]
    if ngroups < 1 or nheads % ngroups:
        raise ShapeError("B", f"B: ngroups (dim 2) = {ngroups} must divide nheads = {nheads}")
    return ngroups


def bind_ssm_gates(params: dict, shape: tuple, io: str, *, dt, A, out, D, z, dt_bias, length: str) -> list:
    """Everything but x, B and C, for x's ``shape`` (batch, length, H, P): dt (batch, length, H) in the ``io``
    dtype; A (H,) fp32; out (batch, length, H, P) in ``io``; D (H,) fp32 (broadcast over P: stride 0) or (H, P);
    z like out; dt_bias (H,) fp32. Records pointers, strides and ``has_*`` flags; returns the arrays read."""
    batch, seqlen, nheads, headdim = shape
    expect_dtype(dt, (io,))
    expect_shape(dt, (batch, seqlen, nheads), f"(batch, {length}, nheads)")
    expect_dtype(A, ("fp32",))
    expect_shape(A, (nheads,), "(nheads,)")
    expect_dtype(out, (io,))
    expect_shape(out, (batch, seqlen, nheads, headdim), f"(batch, {length}, nheads, headdim)")
    params.update(dt=dt.ptr, A=A.ptr, out=out.ptr)
    for arr, dims in ((dt, ("batch", "seqlen", "head")), (A, ("head",)), (out, ("batch", "seqlen", "head"))):
        record_strides(params, arr, dims)
    if D is not None:
        expect_dtype(D, ("fp32",))
        if D.shape == (nheads,):
            params.update(stride_D_head=D.strides[0], stride_D_dim=0)
        else:   # (a 1-D D is told its length, not that it wants 2 dims)
            expect_shape(D, (nheads,) if len(D.shape) == 1 else (nheads, headdim), "(nheads,) or (nheads, headdim)")
            record_strides(params, D, ("head", "dim"))
    if z is not None:
        expect_dtype(z, (io,))
        expect_shape(z, (batch, seqlen, nheads, headdim), f"(batch, {length}, nheads, headdim)")
        record_strides(params, z, ("batch", "seqlen", "head"))
    if dt_bias is not None:
        expect_dtype(dt_bias, ("fp32",))
        expect_shape(dt_bias, (nheads,), "(nheads,)")
        record_strides(params, dt_bias, ("head",))
    for name, arr in (("D", D), ("z", z), ("dt_bias", dt_bias)):
        params[name] = arr.ptr if arr is not None else 0
        params[f"has_{name}"] = int(arr is not None)
    null_absent(params, SSM_STRIDES, ("D", "z", "dt_bias"))
    return [dt, A] + [arr for arr in (D, z, dt_bias) if arr is not None]
