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
from ..validation import (GRID_YZ_MAX, BoundCall, expect_bool, expect_dim, expect_dt_limit, expect_dtype, expect_given,
                          expect_rank, expect_shape, record_strides)
from .base import LaunchPlan

MODES = ("update", "snapshot", "compact")
IO_DTYPES = ("bf16", "fp16", "fp32")
POOL_DTYPES = ("fp32", "bf16", "fp16")
WINDOW = ("window_count", "window_x", "window_B", "window_dt")


class VerifyPlan(LaunchPlan):
    family = "verify"
    grid_rule = "heads,batch"
    param_names = (
        "state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out",
        "state_indices", "snapshot_indices", "num_accepted",
        "window_count", "window_x", "window_B", "window_dt", "rejected",
        "batch", "seqlen", "nheads", "heads_per_group", "num_slots", "window_capacity",
        "stride_state_slot", "stride_state_head",
        "stride_x_batch", "stride_x_seqlen", "stride_x_head",
        "stride_dt_batch", "stride_dt_seqlen", "stride_dt_head",
        "stride_A_head",
        "stride_B_batch", "stride_B_seqlen", "stride_B_group",
        "stride_C_batch", "stride_C_seqlen", "stride_C_group",
        "stride_D_head", "stride_D_dim",
        "stride_z_batch", "stride_z_seqlen", "stride_z_head",
        "stride_dt_bias_head",
        "stride_out_batch", "stride_out_seqlen", "stride_out_head",
        "stride_state_indices_batch",
        "stride_snapshot_indices_batch", "stride_snapshot_indices_seqlen",
        "stride_num_accepted_batch",
        "stride_window_count_slot", "stride_window_count_head",
        "stride_window_x_slot", "stride_window_x_row", "stride_window_x_head",
        "stride_window_B_slot", "stride_window_B_row", "stride_window_B_head",
        "stride_window_dt_slot", "stride_window_dt_row", "stride_window_dt_head",
        "has_D", "has_z", "has_dt_bias", "dt_softplus", "has_rejected",
        "dt_min", "dt_max",
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
        _expect_mode_args(mode, snapshot_indices=snapshot_indices, num_accepted=num_accepted, window_count=window_count,
                          window_x=window_x, window_B=window_B, window_dt=window_dt)

        expect_dtype(x, IO_DTYPES)
        expect_rank(x, 4, "(batch, T, nheads, headdim)")
        batch, seqlen, nheads, headdim = x.shape
        io = (x.dtype,)
        if seqlen < (0 if mode == "compact" else 1):
            raise ShapeError("x", f"x: T (dim 1) must be >= 1 (0 is allowed in compact mode), got {x.shape}")
        expect_dim("x", "batch (dim 0)", batch, maximum=GRID_YZ_MAX)

        expect_dtype(state, POOL_DTYPES)
        expect_rank(state, 4, "(num_slots, nheads, headdim, d_state)")
        num_slots, _, _, d_state = state.shape
        expect_dim("state", "num_slots (dim 0)", num_slots)
        expect_shape(state, (num_slots, nheads, headdim, d_state), "(num_slots, nheads, headdim, d_state) of x")
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

        expect_dtype(dt, io)
        expect_shape(dt, (batch, seqlen, nheads), "(batch, T, nheads) of x")
        expect_dtype(A, ("fp32",))
        expect_shape(A, (nheads,), "(nheads,)")
        expect_rank(B, 4, "(batch, T, ngroups, d_state)")
        ngroups = B.shape[2]
        if ngroups < 1 or nheads % ngroups:
            raise ShapeError("B", f"B: ngroups (dim 2) = {ngroups} must divide nheads = {nheads}")
        for m in (B, C):
            expect_dtype(m, io)
            expect_shape(m, (batch, seqlen, ngroups, d_state), "(batch, T, ngroups, d_state) of x and state")
        expect_dtype(out, io)
        expect_shape(out, x.shape, "(batch, T, nheads, headdim) of x")
        expect_dtype(state_indices, ("int32",))
        expect_shape(state_indices, (batch,), "(batch,)")

        inputs = [x, dt, A, B, C, state_indices]
        outputs = [out, state]
        params = {"x": x.ptr, "dt": dt.ptr, "A": A.ptr, "B": B.ptr, "C": C.ptr, "out": out.ptr, "state": state.ptr,
                  "state_indices": state_indices.ptr, "batch": batch, "seqlen": seqlen, "nheads": nheads,
                  "heads_per_group": nheads // ngroups, "num_slots": num_slots,
                  "dt_softplus": int(dt_softplus), "dt_min": dt_min, "dt_max": dt_max}
        record_strides(params, state, ("slot", "head"))
        record_strides(params, x, ("batch", "seqlen", "head"))
        record_strides(params, dt, ("batch", "seqlen", "head"))
        record_strides(params, A, ("head",))
        record_strides(params, B, ("batch", "seqlen", "group"))
        record_strides(params, C, ("batch", "seqlen", "group"))
        record_strides(params, out, ("batch", "seqlen", "head"))
        record_strides(params, state_indices, ("batch",))

        optional = {"D": None, "z": None, "dt_bias": None, "rejected": None}
        if D is not None:
            optional["D"] = D
            expect_dtype(D, ("fp32",))
            if D.shape == (nheads,):
                params.update(stride_D_head=D.strides[0], stride_D_dim=0)
            else:
                expect_shape(D, (nheads, headdim), "(nheads,) or (nheads, headdim)")
                record_strides(params, D, ("head", "dim"))
        if z is not None:
            optional["z"] = z
            expect_dtype(z, io)
            expect_shape(z, x.shape, "(batch, T, nheads, headdim) of x")
            record_strides(params, z, ("batch", "seqlen", "head"))
        if dt_bias is not None:
            optional["dt_bias"] = dt_bias
            expect_dtype(dt_bias, ("fp32",))
            expect_shape(dt_bias, (nheads,), "(nheads,)")
            record_strides(params, dt_bias, ("head",))
        if rejected is not None:
            optional["rejected"] = rejected
            expect_dtype(rejected, ("int32",))
            expect_shape(rejected, (1,), "(one int32 counter)")
        for name, arr in optional.items():
            params[name] = arr.ptr if arr is not None else 0
            if name != "rejected":
                params[f"has_{name}"] = int(arr is not None)
                if arr is not None:
                    inputs.append(arr)
        params["has_rejected"] = int(rejected is not None)
        if rejected is not None:
            outputs.append(rejected)

        capacity = 0
        if mode == "snapshot":
            expect_dtype(snapshot_indices, ("int32",))
            expect_shape(snapshot_indices, (batch, seqlen), "(batch, T)")
            record_strides(params, snapshot_indices, ("batch", "seqlen"))
            params["snapshot_indices"] = snapshot_indices.ptr
            inputs.append(snapshot_indices)
        if mode == "compact":
            expect_dtype(num_accepted, ("int32",))
            expect_shape(num_accepted, (batch,), "(batch,)")
            record_strides(params, num_accepted, ("batch",))
            params["num_accepted"] = num_accepted.ptr
            inputs.append(num_accepted)
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
        # Arrays this call does not pass (other modes', absent options): null pointer and zero strides.
        for name in ("D", "z", "dt_bias", "rejected", "snapshot_indices", "num_accepted") + WINDOW:
            if params.get(name, 0) == 0:
                params[name] = 0
                params.update((p, 0) for p in self.param_names if p.startswith(f"stride_{name}_"))
        missing = set(self.param_names) - set(params)
        if missing:  # a plan bug, not a caller's: every kernel parameter must get a value
            raise RuntimeError(f"verify plan left kernel parameters unset: {sorted(missing)}")

        return BoundCall(
            constants={"mode": mode, "headdim": headdim, "d_state": d_state, "io_dtype": x.dtype,
                       "pool_dtype": state.dtype},
            grid=(nheads, batch, 1),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )


def _expect_mode_args(mode: str, **given) -> None:
    needed = {"update": (), "snapshot": ("snapshot_indices",), "compact": ("num_accepted",) + WINDOW}[mode]
    for name, value in given.items():
        if name in needed and value is None:
            raise InvalidArgumentError(name, f"{name}: required in {mode} mode")
        if name not in needed and value is not None:
            raise InvalidArgumentError(name, f"{name}: not used in {mode} mode (it takes {needed or 'neither'})")
