"""Launch plan of ``ssd_chunk_cumsum``: Δ preprocessing and the per-chunk cumulative sum of Δ·A.

Call::

    launch("ssd_chunk_cumsum", dt=dt, A=A, dt_out=dt_out, dA_cumsum=dA_cumsum, chunk_size=256,
           dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")), stream=None)

=============  ===============================  =====================  =================================
argument       shape                            dtype                  notes
=============  ===============================  =====================  =================================
dt             (batch, L, H)                    bf16 / fp16 / fp32     any strides; L >= 1
A              (H,)                             fp32                   any stride
dt_bias        (H,) or None                     fp32                   added to dt before softplus
dt_out         (batch, H, nchunks, chunk_size)  fp32                   written: Δ, 0 past L
dA_cumsum      (batch, H, nchunks, chunk_size)  fp32                   written: cumsum of Δ·A per chunk
=============  ===============================  =====================  =================================

``nchunks = ceil(L / chunk_size)``; outputs are caller-owned, may be strided, must not overlap each
other or an input. ``chunk_size`` must be one of the built variants (64, 128, 256 in the full build).
Δ = clamp(softplus?(dt + dt_bias), *dt_limit), softplus(v) = v for v > 20. No workspace.
The kernel runs one CTA per (chunk, batch row, 16 heads): grid rule ``chunks,batch,heads/16``.
"""
from __future__ import annotations

import math

from ..errors import ShapeError
from ..validation import (GRID_YZ_MAX, BoundCall, expect_bool, expect_dim, expect_dt_limit, expect_dtype, expect_given,
                          expect_int, expect_rank, expect_shape, record_strides, stride_names)
from .base import LaunchPlan

DT_DTYPES = ("bf16", "fp16", "fp32")
HEADS_PER_CTA = 16  # the grid rule names it


class ChunkCumsumPlan(LaunchPlan):
    family = "ssd_chunk_cumsum"
    grid_rule = "chunks,batch,heads/16"
    param_names = (
        ("dt", "A", "dt_bias", "dt_out", "dA_cumsum", "batch", "seqlen", "nheads", "nchunks")
        + stride_names("dt", "batch", "seqlen", "head") + stride_names("A", "head") + stride_names("dt_bias", "head")
        + stride_names("dt_out", "batch", "head", "chunk", "pos")
        + stride_names("dA_cumsum", "batch", "head", "chunk", "pos")
        + ("has_dt_bias", "dt_softplus", "dt_min", "dt_max")
    )
    arrays = ("dt", "A", "dt_bias", "dt_out", "dA_cumsum")

    def bind(self, *, dt, A, dt_out, dA_cumsum, chunk_size=256, dt_bias=None, dt_softplus=False,
             dt_limit=(0.0, math.inf)) -> BoundCall:
        """Validate a call (see the module docstring; arrays arrive as DeviceArray). Raises the
        InvalidArgumentError subclasses."""
        chunk_size = expect_int("chunk_size", chunk_size, minimum=1)
        dt_softplus = expect_bool("dt_softplus", dt_softplus)
        dt_min, dt_max = expect_dt_limit(dt_limit)
        expect_given(dt=dt, A=A, dt_out=dt_out, dA_cumsum=dA_cumsum)

        expect_dtype(dt, DT_DTYPES)
        expect_rank(dt, 3, "(batch, seqlen, nheads)")
        batch, seqlen, nheads = dt.shape
        if seqlen < 1:
            raise ShapeError("dt", f"dt: seqlen (dim 1) must be >= 1, got shape {dt.shape}")
        nchunks = -(-seqlen // chunk_size)
        expect_dim("dt", "batch (dim 0)", batch, maximum=GRID_YZ_MAX)
        expect_dim("dt", "seqlen (dim 1)", seqlen)
        expect_dim("dt", "nheads (dim 2)", nheads, maximum=GRID_YZ_MAX)

        expect_dtype(A, ("fp32",))
        expect_shape(A, (nheads,), "(nheads,) matching dt's dim 2")
        inputs = [dt, A]
        if dt_bias is not None:
            expect_dtype(dt_bias, ("fp32",))
            expect_shape(dt_bias, (nheads,), "(nheads,) matching dt's dim 2")
            inputs.append(dt_bias)

        out_shape = (batch, nheads, nchunks, chunk_size)
        outputs = (dt_out, dA_cumsum)
        for out in outputs:
            expect_dtype(out, ("fp32",))
            expect_shape(out, out_shape, "(batch, nheads, ceil(seqlen / chunk_size), chunk_size)")

        params = {
            "dt": dt.ptr, "A": A.ptr, "dt_bias": dt_bias.ptr if dt_bias is not None else 0,
            "dt_out": dt_out.ptr, "dA_cumsum": dA_cumsum.ptr,
            "batch": batch, "seqlen": seqlen, "nheads": nheads, "nchunks": nchunks,
            "stride_A_head": A.strides[0],
            "stride_dt_bias_head": dt_bias.strides[0] if dt_bias is not None else 0,
            "has_dt_bias": int(dt_bias is not None), "dt_softplus": int(dt_softplus),
            "dt_min": dt_min, "dt_max": dt_max,
        }
        record_strides(params, dt, ("batch", "seqlen", "head"))
        for out in outputs:
            record_strides(params, out, ("batch", "head", "chunk", "pos"))
        return BoundCall(
            constants={"chunk_size": chunk_size, "dt_dtype": dt.dtype},
            grid=(nchunks, batch, -(-nheads // HEADS_PER_CTA)),
            params=params,
            inputs=tuple(inputs),
            outputs=outputs,
        )
