"""Device-side causal depthwise conv1d shared by the conv families and the fused conv + SSM verify.

Math (Mamba-2's ``conv1d`` over xBC; state-spaces/mamba ``causal_conv1d_fn`` / ``causal_conv1d_update``), per
channel c of width K (2..4), taps oldest first, ``weight[c, K-1]`` multiplying the current input::

    out_t[c] = act(bias[c] + sum_{k<K} weight[c, k] · u[t-K+1+k])      act = silu or identity

The conv state of a channel is its previous K-1 inputs, oldest first: raw input values, so moving it between
the pool, the registers and a window record never rounds (an fp32 pool holds them exactly, an I/O-dtype pool
holds what the input held). A channel's window lives in MAX_WIDTH - 1 registers, right-aligned: the last K-1
entries are the live ones. Every output is computed by :func:`conv_output` with its fmas in tap order, so the
standalone conv and the fused verify produce the same bits.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.ssm_math import silu

MAX_WIDTH = 4
SLOTS = MAX_WIDTH - 1   # register window entries
ROWS_IN_FLIGHT = 4      # stage_rows: rows whose input loads are issued together (more costs registers)


def pool_combination_error(io_dtype: str, pool_dtype: str, **_) -> str | None:
    """A conv pool holds raw inputs, so it is kept in the I/O dtype or in fp32: any other pair is not a variant
    (the kernel classes' ``combination_error``)."""
    if pool_dtype not in (io_dtype, "fp32"):
        return f"a conv pool is in the I/O dtype ({io_dtype}) or fp32, not {pool_dtype}"
    return None


def empty_window():
    """A channel's window: a tuple of SLOTS fp32 values, right-aligned (scalars, so they stay in registers
    across the row loops)."""
    return tuple(Float32(0.0) for _ in range(SLOTS))


@cute.jit
def _right_aligned(values, count: Int32, size: cutlass.Constexpr):
    """The ``count`` values of a view as a tuple of ``size`` fp32 values, right-aligned (zeros before)."""
    out = []
    for j in cutlass.range_constexpr(size):
        k = j - (size - count)
        value = Float32(0.0)
        if k >= 0:
            value = values[k].to(Float32)
        out.append(value)
    return tuple(out)


@cute.jit
def load_window(taps, width: Int32):
    """The K-1 values of ``taps`` (a (K-1,) view of one pool slot's channel) as a window."""
    return _right_aligned(taps, width - 1, SLOTS)


@cute.jit
def store_window(win, taps, width: Int32, dtype: cutlass.Constexpr):
    """The live K-1 values of ``win`` -> ``taps`` (a (K-1,) view of one pool slot's channel)."""
    for j in cutlass.range_constexpr(SLOTS):
        k = j - (SLOTS - (width - 1))
        if k >= 0:
            taps[k] = win[j].to(dtype)


def push(win, u):
    """The window shifted by one input (the oldest value drops out)."""
    return (*win[1:], u)


@cute.jit
def load_weights(taps, width: Int32):
    """A channel's K weights (a (K,) view) as MAX_WIDTH values, right-aligned like the window."""
    return _right_aligned(taps, width, MAX_WIDTH)


@cute.jit
def conv_output(win, u: Float32, weights, bias: Float32, width: Int32, apply_silu: Int32) -> Float32:
    """act(bias + Σ_k weight[k]·tap_k) over the window and the current input ``u`` (``weights`` from
    :func:`load_weights`). Fmas in tap order (oldest first), starting from the bias."""
    y = bias
    for j in cutlass.range_constexpr(MAX_WIDTH):
        if j >= MAX_WIDTH - width:
            tap = u
            if cutlass.const_expr(j < SLOTS):
                tap = win[j]
            y = cute.math.fma(weights[j], tap, y)
    if apply_silu != 0:
        y = silu(y)
    return y


class ConvViews:
    """The conv arrays of one call as CuTe views, and its run-time options (a trace-time record).

    pool (num_slots, channels, K-1); xBC (batch, T, channels); weight (channels, K); bias (channels,) read only
    when ``has_bias``; rows: the window record's raw rows (num_slots, capacity, channels); snapshots
    (batch, T); out (batch, T, channels) when the conv outputs are stored.
    """

    def __init__(self, *, pool, xBC, weight, bias, has_bias, width, apply_silu, num_slots, rows=None,
                 snapshots=None, out=None):
        self.pool, self.xBC, self.weight, self.bias, self.has_bias = pool, xBC, weight, bias, has_bias
        self.width, self.apply_silu, self.num_slots = width, apply_silu, num_slots
        self.rows, self.snapshots, self.out = rows, snapshots, out

    @cute.jit
    def bias_of(self, c: Int32) -> Float32:
        value = Float32(0.0)
        if self.has_bias != 0:
            value = self.bias[c].to(Float32)
        return value


@cute.jit
def walk_channel(cv: ConvViews, mode: cutlass.Constexpr, b: Int32, slot: Int32, c: Int32, folds: Int32, T: Int32,
                 pool_type: cutlass.Constexpr, io_type: cutlass.Constexpr):
    """One channel of one valid request in a verify mode: fold the first ``folds`` pending rows (compact), then
    the T rows, storing outputs when ``cv.out`` is given and every window the mode writes. The window is read
    from the pool once, so a snapshot into the source slot cannot change what later rows see."""
    K = cv.width
    out, rows = cv.out, cv.rows   # stored to through locals: the DSL cannot carry the record through a loop
    w0, w1, w2 = load_window(cv.pool[slot, c, None], K)
    if cutlass.const_expr(mode == "compact"):
        for i in range(folds):  # (unroll=1 here made ptxas spill 8 bytes in the fp32 compact variant)
            w0, w1, w2 = push((w0, w1, w2), rows[slot, i, c].to(Float32))
        if folds > 0:
            store_window((w0, w1, w2), cv.pool[slot, c, None], K, pool_type)
    bias, weights = Float32(0.0), empty_window() + (Float32(0.0),)
    if cutlass.const_expr(out is not None):   # only the windows are written otherwise (the fused verify's part)
        bias, weights = cv.bias_of(c), load_weights(cv.weight[c, None], K)
    for t in cutlass.range(T, unroll=1):
        u = cv.xBC[b, t, c]
        if cutlass.const_expr(out is not None):
            out[b, t, c] = conv_output((w0, w1, w2), u.to(Float32), weights, bias, K, cv.apply_silu).to(io_type)
        w0, w1, w2 = push((w0, w1, w2), u.to(Float32))
        if cutlass.const_expr(mode == "snapshot"):
            target = cv.snapshots[b, t]
            if target >= 0:
                if target < cv.num_slots:
                    store_window((w0, w1, w2), cv.pool[target, c, None], K, pool_type)
        if cutlass.const_expr(mode == "compact"):
            rows[slot, t, c] = u
    if cutlass.const_expr(mode == "update"):
        store_window((w0, w1, w2), cv.pool[slot, c, None], K, pool_type)


@cute.jit
def stage_rows(cv: ConvViews, staged, column: Int32, b: Int32, slot: Int32, valid: Int32, folds: Int32, c: Int32,
               T: Int32, io_type: cutlass.Constexpr):
    """The conv outputs of channel c for the T new rows (T at most staged's first extent) into
    ``staged[t, column]``, read from global memory: the pool, then the ``folds`` pending rows of the window
    record, then the new rows. Bitwise what :func:`walk_channel` computes for those rows; valid while nothing
    of the request's conv state has been written yet. The loads do not depend on each other: ROWS_IN_FLIGHT
    rows' are issued together."""
    K = cv.width
    weights = load_weights(cv.weight[c, None], K)
    bias = cv.bias_of(c)
    win = []
    for j in cutlass.range_constexpr(SLOTS):
        value = Float32(0.0)
        k = j - (SLOTS - (K - 1))
        if k >= 0:
            value = _tap(cv, b, slot, valid, folds, c, folds + k)
        win.append(value)
    w0, w1, w2 = win
    for t0 in cutlass.range(0, T, ROWS_IN_FLIGHT, unroll=1):
        for j in cutlass.range_constexpr(ROWS_IN_FLIGHT):
            t = t0 + j
            if t < T:
                u = _tap(cv, b, slot, valid, folds, c, folds + t + K - 1)
                staged[t, column] = conv_output((w0, w1, w2), u, weights, bias, K, cv.apply_silu).to(io_type)
                w0, w1, w2 = push((w0, w1, w2), u)


@cute.jit
def _tap(cv: ConvViews, b: Int32, slot: Int32, valid: Int32, folds: Int32, c: Int32, p: Int32) -> Float32:
    """Input p of the request's virtual row sequence: the K-1 pool values, the folded rows, the new rows.
    A padding row (``valid`` 0) reads zeros for the pool part."""
    held = cv.width - 1
    value = Float32(0.0)
    if p < held:
        if valid != 0:
            value = cv.pool[slot, c, p].to(Float32)
    else:
        q = p - held
        if cutlass.const_expr(cv.rows is not None):
            if q < folds:
                value = cv.rows[slot, q, c].to(Float32)
            else:
                value = cv.xBC[b, q - folds, c].to(Float32)
        else:
            value = cv.xBC[b, q, c].to(Float32)
    return value


@cute.jit
def take_ticket(ticket, tid: Int32) -> Int32:
    """This CTA's arrival at ``ticket`` (an int32 pointer to a counter that starts at zero): the counter's value
    before it, in thread 0 (0 elsewhere). Only reads of what the last CTA writes may precede it: their values are
    in hand after the barrier, and thread 0's release orders every thread's accesses before the barrier ahead of
    the arrival (as CUTLASS's barriers arrive). No thread waits for its own stores, and thread 0 does not wait for
    the count: :func:`settle_ticket` reads it, so the arrival's round trip can overlap the CTA's work."""
    cute.arch.sync_threads()
    taken = Int32(0)
    if tid == 0:
        taken = cute.arch.atomic_add(ticket, Int32(1), sem="release", scope="gpu")
    return taken


@cute.jit
def settle_ticket(ticket, taken: Int32, arrivals: Int32, flag, tid: Int32) -> Int32:
    """1 in every thread of the CTA whose arrival (``taken``, from :func:`take_ticket`) was the last of the
    ``arrivals`` CTAs sharing ``ticket``, else 0; the last CTA resets the counter to zero for the next call. Thread 0,
    which read the counter, acquires before the barrier that passes "last" on (CUTLASS's wait), so that every
    thread's writes after it follow every other CTA's reads. ``flag`` is one Int32 of shared memory."""
    if tid == 0:
        last = Int32(0)
        if taken == arrivals - 1:
            last = Int32(1)
            cute.arch.fence_acq_rel_gpu()
            cute.make_tensor(ticket, cute.make_layout((1,)))[0] = Int32(0)
        flag[0] = last
    cute.arch.sync_threads()
    return flag[0]


@cute.jit
def last_arrival(ticket, arrivals: Int32, flag, tid: Int32) -> Int32:
    """:func:`settle_ticket` of an arrival taken now: what the CTAs of one request share in place (a conv window
    read by every head, a window count) is written only by the last one to arrive, after every CTA's reads."""
    return settle_ticket(ticket, take_ticket(ticket, tid), arrivals, flag, tid)
