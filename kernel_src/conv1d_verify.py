"""conv1d_verify: the causal depthwise conv1d before the SSM, on a conv-state pool (update, snapshot, compact).

Math: :mod:`kernel_src.conv_window` (width K in 2..4, optional bias, SiLU or identity). The conv state of a
slot is (channels, K-1): each channel's previous K-1 raw inputs, oldest first. Per request b with slot
s = state_indices[b] and T new rows xBC[b, t, :] (BRIEF §2 "verify", the pre-conv path):

- ``update``:   outputs for every row, the window after the last row written back to slot s.
- ``snapshot``: outputs for every row; the window after row t written to slot snapshot_indices[b, t] (>= 0).
- ``compact``:  shift the first num_accepted[b] pending rows of the slot's window record (raw xBC rows) into
  slot s in place, then run the T new rows from there and store them as the new pending window.

Padding and out-of-range rules are verify's: a negative slot is padding (outputs zero, nothing read or
written), a slot >= num_slots is padding and counted in ``rejected``, num_accepted is clamped to
[0, window_count[s]] (counted when it was outside). The state moves without rounding (raw inputs), so the
three modes agree bitwise by construction.

One thread owns one channel of one request and walks its rows with the window in registers. A CTA covers
128 channels; the CTAs of a request all read the slot's window count and the last one to arrive writes the
new count (a per-slot ticket, :func:`kernel_src.conv_window.last_arrival`).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, i32, ptr, strides
from kernel_src.conv_window import ConvViews, last_arrival, pool_combination_error, walk_channel
from kernel_src.families import expect_constants
from kernel_src.ssm_math import accepted_rows

CHANNELS_PER_CTA = 128


class Conv1dVerify:
    family = "conv1d_verify"
    grid_rule = "channels/128,batch"
    modes = ("update", "snapshot", "compact")
    io_dtypes = ("bf16", "fp16", "fp32")
    pool_dtypes = ("bf16", "fp16", "fp32")

    combination_error = staticmethod(pool_combination_error)

    def __init__(self, mode: str, io_dtype: str, pool_dtype: str):
        expect_constants(self, mode=mode, io_dtype=io_dtype, pool_dtype=pool_dtype)
        self.mode, self.io_dtype, self.pool_dtype = mode, io_dtype, pool_dtype
        self.block = (CHANNELS_PER_CTA, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = 16 if mode == "compact" else 0   # the ticket's flag

    def params(self):
        io, pool = self.io_dtype, self.pool_dtype
        return [
            ptr("conv_state", pool), ptr("xBC", io), ptr("conv_weight", "fp32"), ptr("conv_bias", "fp32"),
            ptr("out", io), ptr("state_indices", "int32"), ptr("snapshot_indices", "int32"),
            ptr("num_accepted", "int32"), ptr("conv_window_count", "int32"), ptr("conv_window_xBC", io),
            ptr("rejected", "int32"), ptr("tickets", "int32"),
            i32("batch"), i32("seqlen"), i32("channels"), i32("width"), i32("num_slots"), i32("window_capacity"),
            *strides("conv_state", "slot", "channel", "tap"), *strides("xBC", "batch", "seqlen", "channel"),
            *strides("conv_weight", "channel", "tap"), *strides("conv_bias", "channel"),
            *strides("out", "batch", "seqlen", "channel"), *strides("state_indices", "batch"),
            *strides("snapshot_indices", "batch", "seqlen"), *strides("num_accepted", "batch"),
            *strides("conv_window_count", "slot"), *strides("conv_window_xBC", "slot", "row", "channel"),
            *strides("tickets", "slot"),
            i32("has_conv_bias"), i32("silu"), i32("has_rejected"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        blocks = (a.channels + CHANNELS_PER_CTA - 1) // CHANNELS_PER_CTA
        self.kernel(args).launch(grid=[blocks, a.batch, 1], block=list(self.block), smem=self.dynamic_smem,
                                 stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        io_type, pool_type = cutlass_dtype(self.io_dtype), cutlass_dtype(self.pool_dtype)
        compact = self.mode == "compact"
        cblock, b, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        c = cblock * CHANNELS_PER_CTA + tid
        T, K, cap = a.seqlen, a.width, a.window_capacity

        def view(pointer, shape, *strides):
            return cute.make_tensor(pointer, cute.make_layout(shape, stride=strides))

        rows = None
        if cutlass.const_expr(compact):
            rows = view(a.conv_window_xBC, (a.num_slots, cap, a.channels), a.stride_conv_window_xBC_slot,
                        a.stride_conv_window_xBC_row, a.stride_conv_window_xBC_channel)
        snapshots = view(a.snapshot_indices, (a.batch, T), a.stride_snapshot_indices_batch,
                         a.stride_snapshot_indices_seqlen)
        cv = ConvViews(
            pool=view(a.conv_state, (a.num_slots, a.channels, K - 1), a.stride_conv_state_slot,
                      a.stride_conv_state_channel, a.stride_conv_state_tap),
            xBC=view(a.xBC, (a.batch, T, a.channels), a.stride_xBC_batch, a.stride_xBC_seqlen, a.stride_xBC_channel),
            weight=view(a.conv_weight, (a.channels, K), a.stride_conv_weight_channel, a.stride_conv_weight_tap),
            bias=view(a.conv_bias, (a.channels,), a.stride_conv_bias_channel), has_bias=a.has_conv_bias,
            width=K, apply_silu=a.silu, num_slots=a.num_slots, rows=rows, snapshots=snapshots,
            out=view(a.out, (a.batch, T, a.channels), a.stride_out_batch, a.stride_out_seqlen, a.stride_out_channel))
        w_count = view(a.conv_window_count, (a.num_slots,), a.stride_conv_window_count_slot)
        # one count per rejected index, by the request's first thread (not one per CTA)
        counts_rejects = (cblock == 0) & (tid == 0)
        if cutlass.const_expr(compact):
            flag = cutlass.utils.SmemAllocator().allocate_tensor(Int32, cute.make_layout((1,)), 16)

        slot = view(a.state_indices, (a.batch,), a.stride_state_indices_batch)[b]
        valid = Int32(0)
        if slot >= 0:
            if slot < a.num_slots:
                valid = Int32(1)
            elif counts_rejects:
                self._count(a)
        live = c < a.channels
        if valid != 0:
            folds = Int32(0)
            if cutlass.const_expr(compact):
                accepted = view(a.num_accepted, (a.batch,), a.stride_num_accepted_batch)[b]
                folds = accepted_rows(accepted, w_count[slot], cap)
                if folds != accepted:
                    if counts_rejects:
                        self._count(a)
            if cutlass.const_expr(self.mode == "snapshot"):
                if counts_rejects:
                    for t in range(T):
                        if snapshots[b, t] >= a.num_slots:
                            self._count(a)
            if live:
                walk_channel(cv, self.mode, b, slot, c, folds, T, pool_type, io_type)
            if cutlass.const_expr(compact):
                blocks = (a.channels + CHANNELS_PER_CTA - 1) // CHANNELS_PER_CTA
                ticket = a.tickets + slot * a.stride_tickets_slot
                if last_arrival(ticket, blocks, flag, tid) != 0:
                    if tid == 0:
                        w_count[slot] = T
        elif live:
            out = cv.out
            for t in range(T):
                out[b, t, c] = Float32(0.0).to(io_type)

    @cute.jit
    def _count(self, a):
        if a.has_rejected != 0:
            cute.arch.atomic_add(a.rejected, Int32(1))
