"""Launch plan of ``verify``: decode and speculative verification on a state pool (BRIEF §2 "verify").

Call::

    launch("verify", mode="update" | "snapshot" | "compact", state=S, x=x, dt=dt, A=A, B=B, C=C, out=out,
           state_indices=idx, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, inf),
           snapshot_indices=None,                                        # snapshot mode
           num_accepted=None, window_count=None, window_x=None, window_B=None, window_dt=None,  # compact
           rejected=None, stream=None)

    # fused pre-conv: xBC and the conv arrays instead of x, B, C
    launch("verify", mode=..., state=S, xBC=xBC, conv_state=conv_pool, conv_weight=w, conv_bias=None,
           activation="silu", tickets=tickets, dt=dt, A=A, out=out, state_indices=idx, ...,   # tickets (slots, G+1)
           conv_window_count=None, conv_window_xBC=None)                 # compact: the conv window record

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
------------------  ------------------------------  ------------------  -------------------------------------------
xBC                 (batch, T, H·P + 2·G·N)         bf16 / fp16         fused: the conv's raw input rows, channels
                                                                        [x | B | C] (G from the count, N from
                                                                        ``state``); any strides
conv_state          (num_slots, channels, K-1)      xBC's dtype / fp32  fused: the conv pool (same slots as state)
conv_weight         (channels, K)                   fp32                K in 2..4 (conv1d_verify's convention)
conv_bias           (channels,) or None             fp32
activation          "silu" or None                                      the conv's activation
tickets             (num_slots, G + 1)              int32               fused: arrival counters (per group, then
                                                                        per slot), zero when created; every call
                                                                        leaves them zero
conv_window_count   (num_slots,)                    int32               fused compact: the conv window record
conv_window_xBC     (num_slots, capacity, ch.)      xBC's dtype           (capacity that of window_x)
==================  ==============================  ==================  ===========================================

Fused calls take at most 16 rows (T) and compute x, B and C as conv1d_verify would (kernel_src/verify.py,
"Fused pre-conv"); they are bitwise the pair conv1d_verify → verify on column views of its output: outputs,
both pools, both window records. The conv's num_accepted clamp uses ``conv_window_count`` and the SSM's
``window_count``, as the pair's would; only the SSM's clamp is counted in ``rejected`` (once per request).

Padding and out-of-range rules: a negative slot is a padding row (outputs zero, nothing of the pool or the
window read or written). A slot >= num_slots is treated the same way and counted in ``rejected``. A
snapshot index >= num_slots is skipped and counted. ``num_accepted`` outside [0, window_count] is clamped
to that range and counted. Slots (and snapshot targets) must be distinct within one call.

The recurrent state is rounded to the pool dtype after every token, as if stored and reloaded, so that T
one-token updates equal one T-token update, and compact replay equals snapshot mode, bitwise. A fresh
window record is all zeros (``window_count`` zero); compact mode accepts T = 0 (fold only: a commit) and
T <= capacity. x, B, C, z and the window's x and B move in 16-byte vectors when every one of them has a 16-byte
aligned base and outer strides in whole vectors (``vector_rows``); any other layout is legal and copied
element by element (same results, slower). No workspace. One CTA per (head, request), or two for a small
update or snapshot call (each running every other row pass of the state): grid rule ``heads,batch,row_splits``.
"""
from __future__ import annotations

import math

from ..errors import AlignmentError, InvalidArgumentError, ShapeError, StrideError
from ..validation import (GRID_YZ_MAX, BoundCall, expect_bool, expect_complete, expect_dim, expect_dt_limit,
                          expect_dtype, expect_given, expect_mode_args, expect_rank, expect_shape, null_absent,
                          expect_state_blocks, record_strides, stride_names, vector_misfit)
from .base import LaunchPlan
from .conv_inputs import ACTIVATIONS, CONV_STRIDES, bind_conv_pool, bind_conv_weights, bind_conv_window, bind_tickets
from .pool_requests import bind_requests
from .ssm_inputs import SSM_STRIDES, bind_ssm_gates, bind_ssm_inputs, x_shape

MODES = ("update", "snapshot", "compact")
# A call of at most this many (head, request) CTAs leaves SMs idle (one CTA each on an H100 / H200's 132 SMs): an
# update or snapshot call then runs its state's row passes in two CTAs (grid z, the kernel's row_splits). A
# constant, not the device's (like ssd_fwd's CTA_SLOTS). Compact and fused calls never split: a later pass
# reads what the last one writes (the window's B rows, the staged conv rows).
SPLIT_AT_MOST = 132
IO_DTYPES = ("bf16", "fp16", "fp32")
FUSED_IO_DTYPES = ("bf16", "fp16")
MAX_FUSED_ROWS = 16                  # the rows a fused call stages at once (kernel_src/verify.py STAGED_ROWS)
POOL_DTYPES = ("fp32", "bf16", "fp16")
WINDOW = ("window_count", "window_x", "window_B", "window_dt")
CONV_WINDOW = ("conv_window_count", "conv_window_xBC")


class VerifyPlan(LaunchPlan):
    family = "verify"
    grid_rule = "heads,batch,row_splits"
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
        + ("has_D", "has_z", "has_dt_bias", "dt_softplus", "has_rejected", "vector_rows", "row_splits",
           "dt_min", "dt_max")
        + ("conv_state", "xBC", "conv_weight", "conv_bias", "conv_window_count", "conv_window_xBC", "tickets",
           "channels", "width")
        + stride_names("conv_state", "slot", "channel", "tap") + stride_names("xBC", "batch", "seqlen", "channel")
        + CONV_STRIDES + stride_names("conv_window_count", "slot")
        + stride_names("conv_window_xBC", "slot", "row", "channel") + stride_names("tickets", "slot", "group")
        + ("has_conv_bias", "silu")
    )
    arrays = (("state", "x", "dt", "A", "B", "C", "out", "state_indices", "D", "z", "dt_bias", "snapshot_indices",
               "num_accepted", "rejected") + WINDOW + ("xBC", "conv_state", "conv_weight", "conv_bias", "tickets")
              + CONV_WINDOW)

    def bind(self, *, mode, state, dt, A, out, state_indices, x=None, B=None, C=None, D=None, z=None, dt_bias=None,
             dt_softplus=False, dt_limit=(0.0, math.inf), snapshot_indices=None, num_accepted=None,
             window_count=None, window_x=None, window_B=None, window_dt=None, rejected=None, xBC=None,
             conv_state=None, conv_weight=None, conv_bias=None, activation="silu", conv_window_count=None,
             conv_window_xBC=None, tickets=None) -> BoundCall:
        """Validate a call (see the module docstring). Raises the InvalidArgumentError subclasses."""
        if mode not in MODES:
            raise InvalidArgumentError("mode", f"mode: expected one of {MODES}, got {mode!r}")
        dt_softplus = expect_bool("dt_softplus", dt_softplus)
        dt_min, dt_max = expect_dt_limit(dt_limit)
        fused = xBC is not None
        expect_given(state=state, dt=dt, A=A, out=out, state_indices=state_indices)
        if fused:
            for name, arr in (("x", x), ("B", B), ("C", C)):
                if arr is not None:
                    raise InvalidArgumentError(name, f"{name}: not taken with xBC (the fused conv computes x, B, C)")
            expect_given(conv_state=conv_state, conv_weight=conv_weight, tickets=tickets)
        else:
            expect_given(x=x, B=B, C=C)
            for name, arr in (("conv_state", conv_state), ("conv_weight", conv_weight), ("conv_bias", conv_bias),
                              ("tickets", tickets), ("conv_window_count", conv_window_count),
                              ("conv_window_xBC", conv_window_xBC)):
                if arr is not None:
                    raise InvalidArgumentError(name, f"{name}: given without xBC (the fused conv's input)")
        conv_window = CONV_WINDOW[:2] if fused else ()
        expect_mode_args(mode, {"snapshot": ("snapshot_indices",), "compact": ("num_accepted",) + WINDOW + conv_window},
                         snapshot_indices=snapshot_indices, num_accepted=num_accepted, window_count=window_count,
                         window_x=window_x, window_B=window_B, window_dt=window_dt,
                         conv_window_count=conv_window_count, conv_window_xBC=conv_window_xBC)

        rows = xBC if fused else x   # the array whose dims 0 and 1 are (batch, T), named in messages
        batch, seqlen, nheads, headdim = x_shape(out if fused else x, FUSED_IO_DTYPES if fused else IO_DTYPES, "T")
        if fused:   # xBC's (batch, T) are out's, checked before the rules on T that name xBC
            expect_dtype(xBC, (out.dtype,))
            expect_rank(xBC, 3, "(batch, T, channels)")
            expect_shape(xBC, (batch, seqlen, xBC.shape[2]), "(batch, T, channels) of out")
        if seqlen < (0 if mode == "compact" else 1):
            raise ShapeError(rows.name, f"{rows.name}: T (dim 1) must be >= 1 (0 is allowed in compact mode), got "
                             f"{rows.shape}")
        if fused and seqlen > MAX_FUSED_ROWS:
            raise ShapeError("xBC", f"xBC: a fused call takes at most {MAX_FUSED_ROWS} rows (T), got {seqlen}; run "
                             "longer inputs through conv1d_fwd + ssd_fwd (prefill)")
        if activation not in ACTIVATIONS:
            raise InvalidArgumentError("activation", f"activation: expected 'silu' or None, got {activation!r}")
        expect_dim(rows.name, "batch (dim 0)", batch, maximum=GRID_YZ_MAX)
        params = {"dt_softplus": int(dt_softplus), "dt_min": dt_min, "dt_max": dt_max}
        expect_dtype(state, POOL_DTYPES)
        expect_rank(state, 4, "(num_slots, nheads, headdim, d_state)")
        if fused:
            d_state = state.shape[3]
            inputs = bind_ssm_gates(params, out.shape, out.dtype, dt=dt, A=A, out=out, D=D, z=z, dt_bias=dt_bias,
                                    length="T")
            inputs += _bind_fused_conv(params, xBC=xBC, conv_state=conv_state, conv_weight=conv_weight,
                                       conv_bias=conv_bias, activation=activation, shape=out.shape, d_state=d_state)
        else:
            (*_, d_state), inputs = bind_ssm_inputs(params, x=x, dt=dt, A=A, B=B, C=C, out=out, D=D, z=z,
                                                    dt_bias=dt_bias, length="T")
        io = (out.dtype,)

        num_slots = state.shape[0]
        expect_dim("state", "num_slots (dim 0)", num_slots)
        expect_shape(state, (num_slots, nheads, headdim, d_state),
                     f"(num_slots, nheads, headdim, d_state) of {'out' if fused else 'x and B'}")
        # each lane reads d_state / 32 contiguous columns as one vector (the kernel's state_align)
        if d_state < 32 or d_state % 32:
            raise ShapeError("state", f"state: d_state (dim 3) = {d_state} must be a positive multiple of 32 (each "
                             "of a warp's 32 lanes holds d_state / 32 columns)")
        expect_state_blocks(state, d_state, "(slot, head)")
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
        if fused:
            if conv_state.shape[0] != num_slots:
                raise ShapeError("conv_state", f"conv_state: {conv_state.shape[0]} slots, the SSM pool has {num_slots} "
                                 "(one slot index for both pools)")
            bind_tickets(params, tickets, (num_slots, nheads // params["heads_per_group"] + 1),
                         "(num_slots, ngroups + 1)")
            outputs += [conv_state, tickets]

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
                raise ShapeError(rows.name, f"{rows.name}: T = {seqlen} new rows exceed the window capacity "
                                 f"{capacity}")
            for name, dims in (("window_count", ("slot", "head")), ("window_x", ("slot", "row", "head")),
                               ("window_B", ("slot", "row", "head")), ("window_dt", ("slot", "row", "head"))):
                arr = window[name]
                record_strides(params, arr, dims)
                params[name] = arr.ptr
                outputs.append(arr)
            if fused:
                conv_capacity = bind_conv_window(params, conv_window_count, conv_window_xBC, num_slots=num_slots,
                                                 channels=params["channels"], io_dtype=out.dtype)
                if conv_capacity != capacity:
                    raise ShapeError("conv_window_xBC", f"conv_window_xBC: capacity {conv_capacity} differs from "
                                     f"window_x's {capacity}")
                outputs += [conv_window_count, conv_window_xBC]
        params["window_capacity"] = capacity
        staged = (z, window_x, window_B) if fused else (x, B, C, z, window_x, window_B)
        params["vector_rows"] = int(not any(vector_misfit(arr) for arr in staged if arr is not None))
        # (a P64 N64 state is one row pass: nothing to split)
        splittable = mode != "compact" and not fused and headdim * d_state > 64 * 64
        splits = 2 if splittable and nheads * batch <= SPLIT_AT_MOST else 1
        params["row_splits"] = splits
        # arrays this call does not pass (other modes', absent options): null pointer and zero strides
        null_absent(params, self.param_names, ("rejected", "snapshot_indices", "num_accepted", "x", "B", "C") + WINDOW
                    + ("xBC", "conv_state", "conv_weight", "conv_bias", "tickets") + CONV_WINDOW)
        for name in ("channels", "width", "has_conv_bias", "silu"):
            params.setdefault(name, 0)
        expect_complete(params, self.param_names, self.family)

        return BoundCall(
            constants={"mode": mode, "headdim": headdim, "d_state": d_state, "io_dtype": out.dtype,
                       "pool_dtype": state.dtype, "conv_dtype": conv_state.dtype if fused else "none"},
            grid=(nheads, batch, splits),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )


def _bind_fused_conv(params: dict, *, xBC, conv_state, conv_weight, conv_bias, activation, shape,
                     d_state: int) -> list:
    """The fused pre-conv's inputs: xBC (batch, T, H·P + 2·G·N) in out's dtype, whose channels are Mamba-2's
    [x | B | C] split (G from the channel count), the conv weights and the conv pool. Records them and
    ``heads_per_group``; returns the arrays read."""
    nheads, headdim = shape[2:]
    channels = xBC.shape[2]   # xBC's dtype, rank, batch and T already checked against out
    groups_width = channels - nheads * headdim
    ngroups = groups_width // (2 * d_state) if groups_width > 0 else 0
    if ngroups < 1 or ngroups * 2 * d_state != groups_width or nheads % ngroups:
        raise ShapeError("xBC", f"xBC: {channels} channels is not nheads·headdim + 2·ngroups·d_state "
                         f"({nheads}·{headdim} + 2·G·{d_state}) for an ngroups G dividing nheads")
    params.update(xBC=xBC.ptr, channels=channels, heads_per_group=nheads // ngroups)
    record_strides(params, xBC, ("batch", "seqlen", "channel"))
    read = [xBC] + bind_conv_weights(params, conv_weight=conv_weight, conv_bias=conv_bias, activation=activation,
                                     channels=channels)
    bind_conv_pool(params, conv_state, channels=channels, width=params["width"], io_dtype=xBC.dtype)
    return read
