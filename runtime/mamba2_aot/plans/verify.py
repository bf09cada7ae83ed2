"""Launch plan of ``verify``: decode and speculative verification on a state pool (BRIEF §2 "verify").

Call::

    launch("verify", mode="update" | "snapshot" | "compact", state=S, x=x, dt=dt, A=A, B=B, C=C, out=out,
           state_indices=idx, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, inf),
           snapshot_indices=None,                                        # snapshot mode
           num_accepted=None, window_count=None, window_x=None, window_B=None, window_dt=None,  # compact
           rejected=None, stream=None)

==================  ==============================  ==================  ===========================================
argument            shape                           dtype               notes
==================  ==============================  ==================  ===========================================
state               (num_slots, H, P, N)            fp32 / bf16 / fp16  the pool; read and written in place. Each
                                                                        (slot, head) block is a contiguous P × N
                                                                        matrix, 16-byte aligned (or d_state / 32
                                                                        elements); slot and head strides are free
                                                                        multiples of d_state / 32
x, z, out           (batch, T, H, P)                bf16 / fp16 / fp32  ``io`` dtype; last dim contiguous
dt                  (batch, T, H)                   io dtype            raw dt (before dt_bias and softplus)
A                   (H,)                            fp32
B, C                (batch, T, G, N)                io dtype            G divides H; last dim contiguous
D                   (H,) or (H, P), or None         fp32
dt_bias             (H,) or None                    fp32
state_indices       (batch,)                        int32               slot of each request; < 0: padding row
snapshot_indices    (batch, T)                      int32               snapshot mode: slot receiving the state
                                                                        after token t; < 0: not written
num_accepted        (batch,)                        int32               compact mode: pending rows to fold first
window_count        (num_slots, H)                  int32               compact mode window record: pending rows
window_x            (num_slots, capacity, H, P)     io dtype              raw x of the pending rows
window_B            (num_slots, capacity, H, N)     io dtype              raw B of the pending rows (per head)
window_dt           (num_slots, capacity, H)        io dtype              raw dt of the pending rows
rejected            (1,) or None                    int32               incremented once per rejected index
==================  ==============================  ==================  ===========================================

Padding and out-of-range rules: a negative slot is a padding row (outputs zero, nothing of the pool or the
window read or written). A slot >= num_slots is treated the same way and counted in ``rejected``. A
snapshot index >= num_slots is skipped and counted. ``num_accepted`` outside [0, window_count] is clamped
to that range and counted. Slots (and snapshot targets) must be distinct within one call.

The recurrent state is rounded to the pool dtype after every token, as if stored and reloaded, so that T
one-token updates equal one T-token update, and compact replay equals snapshot mode, bitwise. A fresh
window record is all zeros (``window_count`` zero); compact mode accepts T = 0 (fold only: a commit) and
T <= capacity. No workspace. One CTA per (head, request): grid rule ``heads,batch``.
"""
from __future__ import annotations

import math

from ..errors import AlignmentError, InvalidArgumentError, ShapeError, StrideError
from ..validation import (GRID_YZ_MAX, BoundCall, expect_bool, expect_complete, expect_dim, expect_dt_limit,
                          expect_dtype, expect_given, expect_mode_args, expect_rank, expect_shape, null_absent,
                          record_strides, stride_names)
from .base import LaunchPlan
from .pool_requests import bind_requests
from .ssm_inputs import SSM_STRIDES, bind_ssm_inputs, x_shape

MODES = ("update", "snapshot", "compact")
IO_DTYPES = ("bf16", "fp16", "fp32")
POOL_DTYPES = ("fp32", "bf16", "fp16")
WINDOW = ("window_count", "window_x", "window_B", "window_dt")


class VerifyPlan(LaunchPlan):
    family = "verify"
    grid_rule = "heads,batch"
    param_names = (
        ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out",
         "state_indices", "snapshot_indices", "num_accepted",
         "window_count", "window_x", "window_B", "window_dt", "rejected",
         "batch", "seqlen", "nheads", "heads_per_group", "num_slots", "window_capacity")
        + stride_names("state", "slot", "head") + SSM_STRIDES
        + stride_names("state_indices", "batch") + stride_names("snapshot_indices", "batch", "seqlen")
        + stride_names("num_accepted", "batch") + stride_names("window_count", "slot", "head")
        + stride_names("window_x", "slot", "row", "head") + stride_names("window_B", "slot", "row", "head")
        + stride_names("window_dt", "slot", "row", "head")
        + ("has_D", "has_z", "has_dt_bias", "dt_softplus", "has_rejected", "dt_min", "dt_max")
    )
    arrays = ("state", "x", "dt", "A", "B", "C", "out", "state_indices", "D", "z", "dt_bias", "snapshot_indices",
              "num_accepted", "rejected") + WINDOW

    def bind(self, *, mode, state, x, dt, A, B, C, out, state_indices, D=None, z=None, dt_bias=None,
             dt_softplus=False, dt_limit=(0.0, math.inf), snapshot_indices=None, num_accepted=None,
             window_count=None, window_x=None, window_B=None, window_dt=None, rejected=None) -> BoundCall:
        """Validate a call (see the module docstring). Raises the InvalidArgumentError subclasses."""
        if mode not in MODES:
            raise InvalidArgumentError("mode", f"mode: expected one of {MODES}, got {mode!r}")
        dt_softplus = expect_bool("dt_softplus", dt_softplus)
        dt_min, dt_max = expect_dt_limit(dt_limit)
        expect_given(state=state, x=x, dt=dt, A=A, B=B, C=C, out=out, state_indices=state_indices)
        expect_mode_args(mode, {"snapshot": ("snapshot_indices",), "compact": ("num_accepted",) + WINDOW},
                         snapshot_indices=snapshot_indices, num_accepted=num_accepted, window_count=window_count,
                         window_x=window_x, window_B=window_B, window_dt=window_dt)

        batch, seqlen, nheads, headdim = x_shape(x, IO_DTYPES, "T")
        if seqlen < (0 if mode == "compact" else 1):
            raise ShapeError("x", f"x: T (dim 1) must be >= 1 (0 is allowed in compact mode), got {x.shape}")
        expect_dim("x", "batch (dim 0)", batch, maximum=GRID_YZ_MAX)
        params = {"dt_softplus": int(dt_softplus), "dt_min": dt_min, "dt_max": dt_max}
        (*_, d_state), inputs = bind_ssm_inputs(params, x=x, dt=dt, A=A, B=B, C=C, out=out, D=D, z=z,
                                                dt_bias=dt_bias, length="T")
        io = (x.dtype,)

        expect_dtype(state, POOL_DTYPES)
        expect_rank(state, 4, "(num_slots, nheads, headdim, d_state)")
        num_slots = state.shape[0]
        expect_dim("state", "num_slots (dim 0)", num_slots)
        expect_shape(state, (num_slots, nheads, headdim, d_state), "(num_slots, nheads, headdim, d_state) of x and B")
        if state.strides[2:] != (d_state, 1):
            raise StrideError("state", f"state: each (slot, head) block must be a contiguous headdim × d_state "
                              f"matrix (strides (..., {d_state}, 1)), got strides {state.strides}")
        # each lane reads d_state / 32 contiguous columns as one vector (the kernel's state_align)
        lane_columns = d_state // 32
        if any(s % lane_columns for s in state.strides[:2]):
            raise StrideError("state", f"state: slot and head strides {state.strides[:2]} must be multiples of "
                              f"d_state / 32 = {lane_columns} elements")
        if state.ptr % min(16, lane_columns * state.itemsize):
            raise AlignmentError("state", f"state: data pointer {state.ptr:#x} must be "
                                 f"{min(16, lane_columns * state.itemsize)}-byte aligned")
        params.update(state=state.ptr, batch=batch, seqlen=seqlen, nheads=nheads, num_slots=num_slots)
        record_strides(params, state, ("slot", "head"))
        read, written = bind_requests(params, mode, batch=batch, seqlen=seqlen, state_indices=state_indices,
                                      snapshot_indices=snapshot_indices, num_accepted=num_accepted, rejected=rejected)
        inputs += read
        outputs = [out, state] + written

        capacity = 0
        if mode == "compact":
            window = {"window_count": window_count, "window_x": window_x, "window_B": window_B,
                      "window_dt": window_dt}
            expect_dtype(window["window_count"], ("int32",))
            expect_shape(window["window_count"], (num_slots, nheads), "(num_slots, nheads)")
            capacity = window["window_x"].shape[1] if len(window["window_x"].shape) == 4 else -1
            for name, shape in (("window_x", (num_slots, capacity, nheads, headdim)),
                                ("window_B", (num_slots, capacity, nheads, d_state)),
                                ("window_dt", (num_slots, capacity, nheads))):
                expect_dtype(window[name], io)
                expect_shape(window[name], shape, "(num_slots, capacity, nheads[, headdim | d_state])")
            if seqlen > capacity:
                raise ShapeError("x", f"x: T = {seqlen} new rows exceed the window capacity {capacity}")
            for name, dims in (("window_count", ("slot", "head")), ("window_x", ("slot", "row", "head")),
                               ("window_B", ("slot", "row", "head")), ("window_dt", ("slot", "row", "head"))):
                arr = window[name]
                record_strides(params, arr, dims)
                params[name] = arr.ptr
                outputs.append(arr)
        params["window_capacity"] = capacity
        # arrays this call does not pass (other modes', absent options): null pointer and zero strides
        null_absent(params, self.param_names, ("rejected", "snapshot_indices", "num_accepted") + WINDOW)
        expect_complete(params, self.param_names, self.family)

        return BoundCall(
            constants={"mode": mode, "headdim": headdim, "d_state": d_state, "io_dtype": x.dtype,
                       "pool_dtype": state.dtype},
            grid=(nheads, batch, 1),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )

