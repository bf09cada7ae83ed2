"""Launch plan of ``conv1d_verify``: the causal conv1d before the SSM on a conv-state pool (BRIEF §2 "verify",
the pre-conv path).

Call::

    launch("conv1d_verify", mode="update" | "snapshot" | "compact", conv_state=pool, xBC=xBC,
           conv_weight=w, out=out, state_indices=idx, conv_bias=None, activation="silu",
           snapshot_indices=None,                                             # snapshot mode
           num_accepted=None, conv_window_count=None, conv_window_xBC=None, tickets=None,   # compact mode
           rejected=None, stream=None)

=================  ===========================  ===============  ===========================================
argument           shape                        dtype            notes
=================  ===========================  ===============  ===========================================
conv_state         (num_slots, channels, K-1)   io dtype / fp32  the pool: each channel's previous K-1 raw
                                                                 inputs, oldest first; read and written in
                                                                 place; any strides
xBC, out           (batch, T, channels)         bf16/fp16/fp32   ``io`` dtype; the raw rows and the conv
                                                                 outputs; any strides
conv_weight        (channels, K)                fp32             K in 2..4; weight[:, K-1] multiplies the
                                                                 current row (causal_conv1d's convention)
conv_bias          (channels,) or None          fp32
activation         "silu" or None
state_indices      (batch,)                     int32            slot of each request; < 0: padding row
snapshot_indices   (batch, T)                   int32            snapshot mode: slot receiving the window
                                                                 after row t; < 0: not written
num_accepted       (batch,)                     int32            compact mode: pending rows to fold first
conv_window_count  (num_slots,)                 int32            compact mode window record: pending rows
conv_window_xBC    (num_slots, capacity, ch.)   io dtype           the raw xBC of the pending rows
tickets            (num_slots,)                 int32            compact mode: arrival counters, zero when
                                                                 created; every call leaves them zero
rejected           (1,) or None                 int32            incremented once per rejected index
=================  ===========================  ===============  ===========================================

``out[b, t, c] = act(conv_bias[c] + Σ_k conv_weight[c, k] · u[t-K+1+k])`` over the slot's window followed by
the rows. Padding and out-of-range rules are verify's: a negative slot is a padding row (outputs zero,
nothing of the pool or the window read or written); a slot >= num_slots is treated the same and counted in
``rejected``; on valid rows, a snapshot index >= num_slots is skipped and counted and ``num_accepted``
outside [0, conv_window_count] is clamped and counted (a window count outside [0, capacity] is clamped to it).
Slots (and snapshot targets) must be distinct within one call, and the tickets zero when it starts (neither
can be checked without reading device memory). Window rows past the new count keep their old bytes.
The window moves without rounding, so T one-row updates equal one T-row update and compact replay equals
snapshot mode, bitwise. A fresh window record is all zeros; compact mode accepts T = 0 (a commit) and
T <= capacity. One CTA per (128 channels, request): grid rule ``channels/128,batch``; no workspace (the
tickets let the last CTA of a request write the shared window count after every CTA has read it).
"""
from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError
from ..validation import (BoundCall, expect_complete, expect_given, expect_mode_args, null_absent,
                          stride_names)
from .base import LaunchPlan
from .conv_inputs import (CONV_STRIDES, bind_conv_pool, bind_conv_rows, bind_conv_weights, bind_conv_window,
                          bind_tickets)
from .pool_requests import bind_requests

MODES = ("update", "snapshot", "compact")
IO_DTYPES = ("bf16", "fp16", "fp32")
CHANNELS_PER_CTA = 128
WINDOW = ("conv_window_count", "conv_window_xBC", "tickets")


class Conv1dVerifyPlan(LaunchPlan):
    family = "conv1d_verify"
    grid_rule = "channels/128,batch"
    param_names = (
        ("conv_state", "xBC", "conv_weight", "conv_bias", "out", "state_indices", "snapshot_indices",
         "num_accepted", "conv_window_count", "conv_window_xBC", "rejected", "tickets",
         "batch", "seqlen", "channels", "width", "num_slots", "window_capacity")
        + stride_names("conv_state", "slot", "channel", "tap") + stride_names("xBC", "batch", "seqlen", "channel")
        + CONV_STRIDES + stride_names("out", "batch", "seqlen", "channel") + stride_names("state_indices", "batch")
        + stride_names("snapshot_indices", "batch", "seqlen") + stride_names("num_accepted", "batch")
        + stride_names("conv_window_count", "slot") + stride_names("conv_window_xBC", "slot", "row", "channel")
        + stride_names("tickets", "slot")
        + ("has_conv_bias", "silu", "has_rejected")
    )
    arrays = ("conv_state", "xBC", "conv_weight", "conv_bias", "out", "state_indices", "snapshot_indices",
              "num_accepted", "rejected") + WINDOW

    def bind(self, *, mode, conv_state, xBC, conv_weight, out, state_indices, conv_bias=None, activation="silu",
             snapshot_indices=None, num_accepted=None, conv_window_count=None, conv_window_xBC=None, tickets=None,
             rejected=None) -> BoundCall:
        """Validate a call (see the module docstring). Raises the InvalidArgumentError subclasses."""
        if mode not in MODES:
            raise InvalidArgumentError("mode", f"mode: expected one of {MODES}, got {mode!r}")
        expect_given(conv_state=conv_state, xBC=xBC, conv_weight=conv_weight, out=out, state_indices=state_indices)
        expect_mode_args(mode, {"snapshot": ("snapshot_indices",), "compact": ("num_accepted",) + WINDOW},
                         snapshot_indices=snapshot_indices, num_accepted=num_accepted,
                         conv_window_count=conv_window_count, conv_window_xBC=conv_window_xBC, tickets=tickets)
        params = {}
        batch, seqlen, channels = bind_conv_rows(params, xBC, out, IO_DTYPES, "T", 0 if mode == "compact" else 1)
        inputs = [xBC] + bind_conv_weights(params, conv_weight=conv_weight, conv_bias=conv_bias,
                                           activation=activation, channels=channels)
        num_slots = bind_conv_pool(params, conv_state, channels=channels, width=params["width"], io_dtype=xBC.dtype)
        params["num_slots"] = num_slots
        read, written = bind_requests(params, mode, batch=batch, seqlen=seqlen, state_indices=state_indices,
                                      snapshot_indices=snapshot_indices, num_accepted=num_accepted, rejected=rejected)
        inputs += read
        outputs = [out, conv_state] + written

        capacity = 0
        if mode == "compact":
            capacity = bind_conv_window(params, conv_window_count, conv_window_xBC, num_slots=num_slots,
                                        channels=channels, io_dtype=xBC.dtype)
            bind_tickets(params, tickets, (num_slots,), "(num_slots,)")
            if seqlen > capacity:
                raise ShapeError("xBC", f"xBC: T = {seqlen} new rows exceed the window capacity {capacity}")
            outputs += [conv_window_count, conv_window_xBC, tickets]
        params["window_capacity"] = capacity
        null_absent(params, self.param_names, ("rejected", "snapshot_indices", "num_accepted") + WINDOW)
        expect_complete(params, self.param_names, self.family)
        return BoundCall(
            constants={"mode": mode, "io_dtype": xBC.dtype, "pool_dtype": conv_state.dtype},
            grid=(-(-channels // CHANNELS_PER_CTA), batch, 1),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )

