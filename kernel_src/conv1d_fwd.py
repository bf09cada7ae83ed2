"""conv1d_fwd: the causal depthwise conv1d over (packed) sequences, the prefill before ``ssd_fwd``.

Math: :mod:`kernel_src.conv_window`. Positions before a sequence's first token read that sequence's initial
window (zeros without one); the final window of a sequence is its last K-1 inputs (the tail of its initial
window when it is shorter than K-1), written to its slot of ``final_states``, a conv pool that verify then
reads without conversion.

Sequences: row b of a (batch, L) input; sequence i = tokens cu_seqlens[i]:cu_seqlens[i+1] of row 0; or a row
split wherever ``seq_idx`` changes (no initial or final windows then: the runtime refuses them).

One thread owns one channel of a 64-token block of a row, with the window in registers. The CTA that holds a
sequence's first token also computes its first K-1 outputs (even past the block's end) and writes its final
window (read from the input's last K-1 rows): every read of a slot's initial window and the write of its final
window then happen in one thread, so a pool read and written in place (initial_states is final_states) is safe.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, i32, ptr, strides
from kernel_src.conv_window import (ConvViews, conv_output, empty_window, load_weights, load_window,
                                    pool_combination_error, push, store_window)
from kernel_src.families import expect_constants

CHANNELS_PER_CTA = 128
TOKENS_PER_CTA = 64


class Conv1dForward:
    family = "conv1d_fwd"
    grid_rule = "channels/128,seqlen/64,batch"
    io_dtypes = ("bf16", "fp16", "fp32")
    pool_dtypes = ("bf16", "fp16", "fp32")

    combination_error = staticmethod(pool_combination_error)

    def __init__(self, io_dtype: str, pool_dtype: str):
        expect_constants(self, io_dtype=io_dtype, pool_dtype=pool_dtype)
        self.io_dtype, self.pool_dtype = io_dtype, pool_dtype
        self.block = (CHANNELS_PER_CTA, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = 0

    def params(self):
        io, pool = self.io_dtype, self.pool_dtype
        return [
            ptr("xBC", io), ptr("conv_weight", "fp32"), ptr("conv_bias", "fp32"), ptr("out", io),
            ptr("initial_states", pool), ptr("initial_state_indices", "int32"),
            ptr("final_states", pool), ptr("final_state_indices", "int32"),
            ptr("seq_idx", "int32"), ptr("cu_seqlens", "int32"),
            i32("batch"), i32("seqlen"), i32("channels"), i32("width"), i32("num_seqs"),
            i32("num_initial_slots"), i32("num_final_slots"),
            *strides("xBC", "batch", "seqlen", "channel"), *strides("conv_weight", "channel", "tap"),
            *strides("conv_bias", "channel"), *strides("out", "batch", "seqlen", "channel"),
            *strides("initial_states", "slot", "channel", "tap"), *strides("initial_state_indices", "seq"),
            *strides("final_states", "slot", "channel", "tap"), *strides("final_state_indices", "seq"),
            *strides("seq_idx", "batch", "seqlen"), *strides("cu_seqlens", "seq"),
            i32("has_conv_bias"), i32("silu"), i32("has_initial_states"), i32("has_initial_state_indices"),
            i32("has_final_states"), i32("has_final_state_indices"), i32("has_seq_idx"), i32("has_cu_seqlens"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        grid = [(a.channels + CHANNELS_PER_CTA - 1) // CHANNELS_PER_CTA,
                (a.seqlen + TOKENS_PER_CTA - 1) // TOKENS_PER_CTA, a.batch]
        self.kernel(args).launch(grid=grid, block=list(self.block), smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        io_type, pool_type = cutlass_dtype(self.io_dtype), cutlass_dtype(self.pool_dtype)
        cblock, tblock, row = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        c = cblock * CHANNELS_PER_CTA + tid
        L, K = a.seqlen, a.width

        def view(pointer, shape, *strides):
            return cute.make_tensor(pointer, cute.make_layout(shape, stride=strides))

        cv = ConvViews(
            pool=view(a.initial_states, (a.num_initial_slots, a.channels, K - 1), a.stride_initial_states_slot,
                      a.stride_initial_states_channel, a.stride_initial_states_tap),
            xBC=view(a.xBC, (a.batch, L, a.channels), a.stride_xBC_batch, a.stride_xBC_seqlen, a.stride_xBC_channel),
            weight=view(a.conv_weight, (a.channels, K), a.stride_conv_weight_channel, a.stride_conv_weight_tap),
            bias=view(a.conv_bias, (a.channels,), a.stride_conv_bias_channel), has_bias=a.has_conv_bias,
            width=K, apply_silu=a.silu, num_slots=a.num_initial_slots,
            out=view(a.out, (a.batch, L, a.channels), a.stride_out_batch, a.stride_out_seqlen, a.stride_out_channel))
        final = view(a.final_states, (a.num_final_slots, a.channels, K - 1), a.stride_final_states_slot,
                     a.stride_final_states_channel, a.stride_final_states_tap)
        seq_idx = view(a.seq_idx, (a.batch, L), a.stride_seq_idx_batch, a.stride_seq_idx_seqlen)
        cu = view(a.cu_seqlens, (a.num_seqs + 1,), a.stride_cu_seqlens_seq)

        if tid + cblock * CHANNELS_PER_CTA < a.channels:
            self._channel(a, cv, final, seq_idx, cu, row, tblock, c, io_type, pool_type)

    @cute.jit
    def _channel(self, a, cv, final, seq_idx, cu, row, tblock, c, io_type: cutlass.Constexpr,
                 pool_type: cutlass.Constexpr):
        """Channel c of one 64-token block of a row: its outputs, then the final windows of the sequences whose
        first token lies in the block."""
        L, K = a.seqlen, a.width
        packed = a.has_cu_seqlens != 0
        out = cv.out
        t0 = tblock * TOKENS_PER_CTA
        own_end = cute.math.min(t0 + TOKENS_PER_CTA, L)
        # The sequence holding t0: [start, end) and its number s (rows: s = row, the whole row).
        s = row
        start = Int32(0)
        end = L
        walk_end = own_end
        if packed:
            s = self._first_sequence_ending_after(a, cu, t0)
            start, end = self._bounds(a, cu, s)
            walk_end = cute.math.min(own_end + K - 2, L)   # the first K-1 outputs of sequences starting here
        if a.has_seq_idx != 0:
            for back in cutlass.range(1, K, unroll=1):
                q = t0 - back
                if q >= start:
                    if seq_idx[row, q] != seq_idx[row, q + 1]:
                        start = q + 1
        bias = cv.bias_of(c)
        weights = load_weights(cv.weight[c, None], K)
        w0, w1, w2 = empty_window()
        for t in cutlass.range(t0, walk_end, unroll=1):
            if packed:
                while t >= end and s < a.num_seqs - 1:
                    s = s + 1
                    start, end = self._bounds(a, cu, s)
            elif a.has_seq_idx != 0:
                if t > 0:
                    if seq_idx[row, t] != seq_idx[row, t - 1]:
                        start = t
            owns_start = (start >= t0) & (start < own_end)
            if t == start:
                w0, w1, w2 = empty_window()
                if owns_start:
                    w0, w1, w2 = self._initial_window(a, cv, s, c)
            elif t == t0:
                w0, w1, w2 = self._window_before(cv, row, c, t, start, K)
            inside = (t >= start) & (t < end)
            mine = t < own_end
            if packed and t - start < K - 1:
                mine = owns_start
            u = cv.xBC[row, t, c].to(Float32)
            if inside:
                if mine:
                    out[row, t, c] = conv_output((w0, w1, w2), u, weights, bias, K, cv.apply_silu).to(io_type)
            elif t < own_end:
                # a row outside every cu_seqlens sequence: zero, so that ssd_fwd can read this output as is (it
                # weights such rows by zero, which a stale NaN would survive)
                out[row, t, c] = Float32(0.0).to(io_type)
            w0, w1, w2 = push((w0, w1, w2), u)

        if a.has_final_states != 0:
            if packed:
                s = self._first_sequence_starting_at(a, cu, t0)
                last_block = own_end == L
                while s < a.num_seqs and (cute.math.min(cute.math.max(cu[s], Int32(0)), L) < own_end or last_block):
                    start, end = self._bounds(a, cu, s)
                    self._store_final(a, cv, final, row, s, c, start, end, pool_type)
                    s = s + 1
            elif tblock == 0:
                self._store_final(a, cv, final, row, row, c, Int32(0), L, pool_type)

    @cute.jit
    def _bounds(self, a, cu, s):
        """Sequence s of cu_seqlens as [start, end), clamped into [0, L] (a bad entry never reads out of bounds)."""
        start = cute.math.min(cute.math.max(cu[s], Int32(0)), a.seqlen)
        end = cute.math.min(cute.math.max(cu[s + 1], start), a.seqlen)
        return start, end

    @cute.jit
    def _first_sequence_ending_after(self, a, cu, t):
        """The first sequence s with cu_seqlens[s + 1] > t (the one holding token t; the last if none)."""
        lo = Int32(0)
        hi = a.num_seqs - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cu[mid + 1] > t:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @cute.jit
    def _first_sequence_starting_at(self, a, cu, t):
        """The first sequence s with cu_seqlens[s] >= t (num_seqs if none)."""
        lo = Int32(0)
        hi = a.num_seqs
        while lo < hi:
            mid = (lo + hi) // 2
            if cu[mid] >= t:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @cute.jit
    def _initial_window(self, a, cv, s, c):
        """Sequence s's initial window of channel c (zeros without initial states or with a slot out of range)."""
        win = empty_window()
        if a.has_initial_states != 0:
            slot = s
            if a.has_initial_state_indices != 0:
                slot = cute.make_tensor(a.initial_state_indices, cute.make_layout(
                    (a.num_seqs,), stride=(a.stride_initial_state_indices_seq,)))[s]
            if slot >= 0 and slot < a.num_initial_slots:
                win = load_window(cv.pool[slot, c, None], a.width)
        return win

    @cute.jit
    def _window_before(self, cv, row, c, t, start, K):
        """The window entering token t from the input rows before it (zeros before the sequence's start)."""
        win = empty_window()
        for i in cutlass.range(K - 1, unroll=1):
            back = K - 1 - i
            value = Float32(0.0)
            if t - back >= start:
                value = cv.xBC[row, t - back, c].to(Float32)
            win = push(win, value)
        return win

    @cute.jit
    def _store_final(self, a, cv, final, row, s, c, start, end, pool_type):
        """Sequence s's final window: its initial window followed by its last K-1 inputs."""
        slot = s
        if a.has_final_state_indices != 0:
            slot = cute.make_tensor(a.final_state_indices, cute.make_layout(
                (a.num_seqs,), stride=(a.stride_final_state_indices_seq,)))[s]
        if slot >= 0 and slot < a.num_final_slots:
            win = self._initial_window(a, cv, s, c)
            for t in cutlass.range(cute.math.max(start, end - (a.width - 1)), end, unroll=1):
                win = push(win, cv.xBC[row, t, c].to(Float32))
            store_window(win, final[slot, c, None], a.width, pool_type)
