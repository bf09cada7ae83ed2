"""fp64 reference for the causal depthwise conv1d before the SSM (Mamba-2's ``conv1d`` over xBC).

Math (per channel c, width K, taps oldest first; state = the previous K-1 inputs, oldest first)::

    out_t[c] = act( bias[c] + sum_{k=0}^{K-1} weight[c, k] · u[c, t-K+1+k] ),   act = silu or identity

where u is xBC and positions before a sequence's first token read that sequence's initial conv window
(zeros if none): the convention of state-spaces/mamba's ``causal_conv1d_fn`` / ``causal_conv1d_update``
(``weight[:, -1]`` multiplies the current token).

Prefill (:func:`conv1d_prefill`) and the verify modes (:func:`conv1d_update`, :func:`conv1d_snapshot`,
:func:`conv1d_compact`) all use :class:`ConvStep`; pool conventions are those of ``reference.verify``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._common import FP64, as_float, check_shape, sequence_layout
from .recurrence import scan_sequences
from .verify import CompactResult, VerifyResult, WindowRecord, run_compact, run_verify

ACTIVATIONS = {"silu": F.silu, None: lambda y: y}


@dataclass(frozen=True)
class ConvStep:
    """One token of the causal depthwise conv1d (a ``recurrence.Step``).

    State: (channels, K-1), the previous K-1 inputs, oldest first. Row: xBC (channels).
    """

    weight: torch.Tensor          # (channels, K)
    bias: torch.Tensor | None     # (channels,)
    activation: str | None
    window_keys = ("xBC",)
    out_key = "xBC"

    def advance(self, state, row):
        return torch.cat([state[:, 1:], row["xBC"][:, None]], dim=1)

    def output(self, state_before, state_after, row):
        taps = torch.cat([state_before, row["xBC"][:, None]], dim=1)   # (channels, K)
        y = (taps * self.weight).sum(-1)
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


def _conv(xBC, weight, bias, activation, compute_dtype, pool=None):
    """Validate (pool: (num_slots, channels, K-1) when given); return (ConvStep, rows)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    xBC, weight, bias = (as_float(t, compute_dtype) for t in (xBC, weight, bias))
    channels, width = weight.shape
    if width < 2:
        raise ValueError(f"conv width K={width} must be >= 2")
    check_shape("xBC", xBC, (*xBC.shape[:2], channels))
    check_shape("bias", bias, (channels,))
    if pool is not None:
        check_shape("conv_pool", pool, (pool.shape[0], channels, width - 1))
    return ConvStep(weight, bias, activation), {"xBC": xBC}


def conv1d_prefill(xBC, weight, bias=None, activation="silu", *, initial_conv_states=None, seq_idx=None,
                   cu_seqlens=None):
    """Causal conv1d over (packed) sequences.

    xBC (B, L, channels); weight (channels, K); bias (channels); initial_conv_states
    (num_seqs, channels, K-1) or None (zeros); seq_idx / cu_seqlens: the packing convention of
    ``reference._common.SequenceLayout``. Returns {"out": (B, L, channels), "final_conv_states":
    (num_seqs, channels, K-1)} in fp64; each final window holds the sequence's last K-1 inputs (the
    tail of its initial window when the sequence is shorter than K-1).
    """
    step, rows = _conv(xBC, weight, bias, activation, FP64)
    batch, seqlen, channels = rows["xBC"].shape
    layout = sequence_layout(batch, seqlen, seq_idx, cu_seqlens)
    window_shape = (layout.num_seqs, channels, weight.shape[1] - 1)
    initial = as_float(initial_conv_states)
    if initial is None:
        initial = torch.zeros(window_shape, dtype=FP64)
    check_shape("initial_conv_states", initial, window_shape)
    out, finals, _ = scan_sequences(step, layout, rows, initial)
    return {"out": out, "final_conv_states": finals}


def conv1d_update(conv_pool, state_indices, xBC, weight, bias=None, activation="silu", *, pool_dtype=None,
                  compute_dtype=FP64) -> VerifyResult:
    """Update mode on a conv-state pool (num_slots, channels, K-1): T tokens xBC (Bt, T, channels) from
    ``conv_pool[state_indices[b]]``, final window written back. Out: (Bt, T, channels)."""
    step, rows = _conv(xBC, weight, bias, activation, compute_dtype, conv_pool)
    return run_verify(step, conv_pool, state_indices, rows, write_final=True, pool_dtype=pool_dtype,
                      compute_dtype=compute_dtype)


def conv1d_snapshot(conv_pool, state_indices, xBC, weight, bias=None, activation="silu", *, snapshot_indices,
                    pool_dtype=None, compute_dtype=FP64) -> VerifyResult:
    """Snapshot mode on a conv-state pool: the window after token t goes to ``snapshot_indices[b, t]``."""
    step, rows = _conv(xBC, weight, bias, activation, compute_dtype, conv_pool)
    return run_verify(step, conv_pool, state_indices, rows, snapshot_indices=snapshot_indices,
                      write_final=False, pool_dtype=pool_dtype, compute_dtype=compute_dtype)


def conv1d_compact(conv_pool, window, state_indices, xBC, weight, bias=None, activation="silu", *,
                   num_accepted, pool_dtype=None, compute_dtype=FP64) -> CompactResult:
    """Compact replay on a conv-state pool; window rows are xBC (channels) (:func:`conv_window`)."""
    step, rows = _conv(xBC, weight, bias, activation, compute_dtype, conv_pool)
    return run_compact(step, conv_pool, window, state_indices, num_accepted, rows, pool_dtype=pool_dtype,
                       compute_dtype=compute_dtype)


def conv_window(num_slots: int, capacity: int, channels: int) -> WindowRecord:
    """An empty conv :class:`WindowRecord` (xBC (channels) per row)."""
    return WindowRecord.empty(num_slots, capacity, xBC=(channels,))
