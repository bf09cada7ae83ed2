"""The causal conv1d's inputs every conv family takes (xBC, conv_weight, conv_bias, activation) and its state
pool, with one validation of them for every launch plan (the standalone conv families and the fused verify)."""
from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError, StrideError
from ..validation import (GRID_YZ_MAX, expect_dim, expect_dtype, expect_rank, expect_shape, null_absent, record_strides,
                          stride_names)

MAX_WIDTH = 4          # the kernels' register window (kernel_src.conv_window.MAX_WIDTH)
ACTIVATIONS = ("silu", None)

# The kernels' strides for the conv weights, bias and pool, name for name.
CONV_STRIDES = (stride_names("conv_weight", "channel", "tap") + stride_names("conv_bias", "channel"))


def bind_conv_rows(params: dict, xBC, out, io_dtypes: tuple[str, ...], length: str, min_length: int) -> tuple:
    """xBC (batch, length, channels) in one of ``io_dtypes`` and out like it, any strides; ``length`` names dim 1
    in messages. Records them; returns xBC's shape."""
    expect_dtype(xBC, io_dtypes)
    expect_rank(xBC, 3, f"(batch, {length}, channels)")
    batch, seqlen, channels = xBC.shape
    if seqlen < min_length:
        raise ShapeError("xBC", f"xBC: {length} (dim 1) must be >= {min_length}, got shape {xBC.shape}")
    expect_dim("xBC", "batch (dim 0)", batch, maximum=GRID_YZ_MAX)
    expect_dim("xBC", f"{length} (dim 1)", seqlen)
    expect_dim("xBC", "channels (dim 2)", channels)
    expect_dtype(out, (xBC.dtype,))
    expect_shape(out, xBC.shape, f"(batch, {length}, channels) of xBC")
    params.update(batch=batch, seqlen=seqlen, channels=channels, xBC=xBC.ptr, out=out.ptr)
    record_strides(params, xBC, ("batch", "seqlen", "channel"))
    record_strides(params, out, ("batch", "seqlen", "channel"))
    return batch, seqlen, channels


def bind_conv_weights(params: dict, *, conv_weight, conv_bias, activation, channels: int) -> list:
    """conv_weight (channels, K) fp32 with K in 2..4, conv_bias (channels,) fp32 or None, activation "silu" or
    None. Records pointers, strides, ``width``, ``has_conv_bias`` and ``silu``; returns the arrays read."""
    if activation not in ACTIVATIONS:
        raise InvalidArgumentError("activation", f"activation: expected 'silu' or None, got {activation!r}")
    expect_dtype(conv_weight, ("fp32",))
    expect_rank(conv_weight, 2, "(channels, width)")
    width = conv_weight.shape[1]
    if not 2 <= width <= MAX_WIDTH:
        raise ShapeError("conv_weight", f"conv_weight: width (dim 1) = {width} must be in 2..{MAX_WIDTH}")
    expect_shape(conv_weight, (channels, width), "(channels, width) of xBC")
    record_strides(params, conv_weight, ("channel", "tap"))
    params.update(conv_weight=conv_weight.ptr, width=width, silu=int(activation == "silu"),
                  has_conv_bias=int(conv_bias is not None), conv_bias=0)
    if conv_bias is not None:
        expect_dtype(conv_bias, ("fp32",))
        expect_shape(conv_bias, (channels,), "(channels,)")
        record_strides(params, conv_bias, ("channel",))
        params["conv_bias"] = conv_bias.ptr
    null_absent(params, CONV_STRIDES, ("conv_bias",))
    return [conv_weight] + ([conv_bias] if conv_bias is not None else [])


def bind_conv_pool(params: dict, conv_state, *, channels: int, width: int, io_dtype: str) -> int:
    """A conv-state pool (num_slots, channels, width - 1) in the I/O dtype or fp32 (raw inputs, held exactly),
    any strides. Records its pointer and strides; returns num_slots."""
    allowed = tuple(dict.fromkeys((io_dtype, "fp32")))
    expect_dtype(conv_state, allowed)
    expect_rank(conv_state, 3, "(num_slots, channels, width - 1)")
    num_slots = conv_state.shape[0]
    expect_dim("conv_state", "num_slots (dim 0)", num_slots)
    expect_shape(conv_state, (num_slots, channels, width - 1), "(num_slots, channels, width - 1) of conv_weight")
    if conv_state.strides[0] == 0 and num_slots > 1:
        raise StrideError("conv_state", "conv_state: slot stride 0 makes every slot the same memory")
    params["conv_state"] = conv_state.ptr
    record_strides(params, conv_state, ("slot", "channel", "tap"))
    return num_slots


def bind_conv_window(params: dict, conv_window_count, conv_window_xBC, *, num_slots: int, channels: int,
                     io_dtype: str) -> int:
    """The conv window record: count (num_slots,) int32 and raw rows (num_slots, capacity, channels) in the I/O
    dtype. Records them; returns the capacity."""
    expect_dtype(conv_window_count, ("int32",))
    expect_shape(conv_window_count, (num_slots,), "(num_slots,)")
    expect_dtype(conv_window_xBC, (io_dtype,))
    expect_rank(conv_window_xBC, 3, "(num_slots, capacity, channels)")
    capacity = conv_window_xBC.shape[1]
    expect_dim("conv_window_xBC", "capacity (dim 1)", capacity)
    expect_shape(conv_window_xBC, (num_slots, capacity, channels), "(num_slots, capacity, channels)")
    for arr, dims in ((conv_window_count, ("slot",)), (conv_window_xBC, ("slot", "row", "channel"))):
        record_strides(params, arr, dims)
        params[arr.name] = arr.ptr
    return capacity


def bind_tickets(params: dict, tickets, shape: tuple[int, ...], dims: str) -> None:
    """tickets ``shape`` int32 (``dims`` names its dims, e.g. "(num_slots, ngroups + 1)"): the arrival counters
    that let the last CTA to finish write what other CTAs of its request read (zero when created; every call
    leaves them zero). Records the pointer and a stride per dim (slot, then group)."""
    expect_dtype(tickets, ("int32",))
    expect_shape(tickets, shape, dims)
    record_strides(params, tickets, ("slot", "group")[:len(shape)])
    params["tickets"] = tickets.ptr
