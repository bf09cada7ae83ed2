"""Device-side math shared by every family, so that all kernels compute Δ and the gates the same way."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

SOFTPLUS_IDENTITY_ABOVE = 20.0


@cute.jit
def delta_from_dt(dt: Float32, dt_bias: Float32, dt_softplus: Int32, dt_min: Float32, dt_max: Float32) -> Float32:
    """Δ = clamp(softplus?(dt + dt_bias), dt_min, dt_max), with softplus(v) = v above 20 (BRIEF §2)."""
    delta = dt + dt_bias
    if dt_softplus != 0:
        if delta <= Float32(SOFTPLUS_IDENTITY_ABOVE):
            delta = cute.math.log1p(cute.math.exp(delta))
    return cute.math.min(cute.math.max(delta, dt_min), dt_max)


@cute.jit
def delta_slope(v: Float32, dt_softplus: Int32, dt_min: Float32, dt_max: Float32) -> Float32:
    """dΔ/d(dt) at v = dt + dt_bias, for Δ of :func:`delta_from_dt`: softplus' sigmoid(v) (1 on its identity branch
    above 20, or without softplus), 0 where dt_min / dt_max clamp. (A gradient times it is ±0 on a clamped row, or NaN
    if that gradient is not finite, where torch.clamp's backward gives 0.)"""
    value = v
    slope = Float32(1.0)
    if dt_softplus != 0:
        if v <= Float32(SOFTPLUS_IDENTITY_ABOVE):
            value = cute.math.log1p(cute.math.exp(v))
            slope = sigmoid(v)
    return Float32(cutlass.select_((value >= dt_min) & (value <= dt_max), slope, Float32(0.0)))


@cute.jit
def accepted_rows(accepted: Int32, count: Int32, capacity: Int32) -> Int32:
    """Compact replay: how many pending rows to fold, ``num_accepted`` clamped to [0, the window count] (the count
    itself clamped to [0, capacity]). A result other than ``accepted`` is a rejected index."""
    pending = cute.math.min(cute.math.max(count, Int32(0)), capacity)
    return cute.math.min(cute.math.max(accepted, Int32(0)), pending)


@cute.jit
def warp_inclusive_scan(value: Float32, lane: Int32) -> Float32:
    """Inclusive prefix sum over the 32 lanes of a warp (shuffle-up steps of 1, 2, 4, 8, 16)."""
    return warp_inclusive_scans([value], lane)[0]


@cute.jit
def warp_inclusive_scans(values: list, lane: Int32) -> list:
    """:func:`warp_inclusive_scan` of several independent values, step by step side by side: their shuffles are
    in flight together instead of one scan's latency after another's."""
    values = list(values)
    for level in cutlass.range_constexpr(5):
        neighbours = [cute.arch.shuffle_sync_up(v, 1 << level) for v in values]
        values = [Float32(cutlass.select_(lane >= (1 << level), v + n, v)) for v, n in zip(values, neighbours)]
    return values


@cute.jit
def sigmoid(v: Float32) -> Float32:
    """1 / (1 + e^-v) with the approximate reciprocal (no IEEE division and its slow path); 0 for v below ~-88,
    where e^-v overflows."""
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-v))


@cute.jit
def silu(v: Float32) -> Float32:
    """v · sigmoid(v)."""
    return v * sigmoid(v)


@cute.jit
def silu_approx(v):
    """v · sigmoid(v) = h + h · tanh(h), h = v / 2, using the one-instruction tanh.approx (relative error ~2^-11):
    for outputs rounded to bf16 / fp16, at half the special-function cost of :func:`silu`. Takes scalars or
    vectors."""
    half = v * 0.5
    return half + half * cute.math.tanh(half, approx=True)
