"""Shared plumbing for the reference: input conversion, rounding, and the packed-sequence layout.

Every public reference function accepts numpy arrays or torch tensors of any dtype on any device.
The values are taken as they are (they are already the rounded values a kernel sees) and only then
moved to the CPU and upcast, so the reference computes on exactly the kernel's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FP64 = torch.float64


def as_float(t, dtype: torch.dtype = FP64) -> torch.Tensor | None:
    """numpy array / torch tensor / scalar -> CPU tensor of `dtype` (None stays None).

    Keeps the autograd graph (``Tensor.to`` is differentiable), so fp64 leaves that require grad
    flow through the reference.
    """
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    return torch.as_tensor(t).to(device="cpu", dtype=dtype)


def as_index(t) -> torch.Tensor | None:
    """Integer array (seq_idx, cu_seqlens, slot indices, counts) -> CPU int64 tensor."""
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    t = torch.as_tensor(t)
    if t.is_floating_point():
        raise TypeError(f"index tensor must have an integer dtype, got {t.dtype}")
    return t.to(device="cpu", dtype=torch.int64)


TF32 = "tf32"   # a tensor-core operand format (fp32 range, 10-bit mantissa); only for precision emulation


def round_to(t: torch.Tensor, dtype) -> torch.Tensor:
    """Round `t` to `dtype` (round-to-nearest-even, as a kernel's store does) and return it in t's dtype.

    ``dtype``: a torch float dtype, :data:`TF32`, or None (no rounding).
    """
    if dtype is None:
        return t
    if dtype == TF32:
        bits = t.to(torch.float32).view(torch.int32)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF          # RNE to 10 mantissa bits
        return bits.view(torch.float32).to(t.dtype)
    return t.to(dtype).to(t.dtype)


def expand_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(..., G, N) -> (..., H, N): head h reads group h // (H // G) (BRIEF §2)."""
    ngroups = t.shape[-2]
    if nheads % ngroups:
        raise ValueError(f"nheads={nheads} is not a multiple of ngroups={ngroups}")
    return t.repeat_interleave(nheads // ngroups, dim=-2)


def check_shape(name: str, t: torch.Tensor | None, expected: tuple) -> None:
    if t is not None and tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(expected)}")


@dataclass(frozen=True)
class Segment:
    """One sequence of a (possibly packed) batch: tokens ``row, start:end`` form sequence number ``seq``."""

    row: int
    start: int
    end: int
    seq: int


@dataclass(frozen=True)
class SequenceLayout:
    """Where the sequences of a (B, L) batch lie.

    Convention (used by every reference function that takes ``seq_idx`` / ``cu_seqlens``):

    - neither given: row b is sequence b (``num_seqs == B``).
    - ``cu_seqlens`` (nseq+1,) int32, B must be 1: sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
      (empty sequences allowed: their final state is their initial state).
    - ``seq_idx`` (B, L) int32, non-decreasing along L in every row: a sequence starts at position 0 of
      every row and wherever ``seq_idx[b, l] != seq_idx[b, l-1]``. Only the changes matter, not the
      values. Sequences are numbered in row-major order of their first token, so an all-zero
      ``seq_idx`` gives sequence b == row b (identical to passing nothing), and ``seq_idx`` built from
      ``cu_seqlens`` numbers sequences exactly as ``cu_seqlens`` does.

    Per-sequence tensors (``initial_states``, ``final_states``, conv windows) are indexed by this
    sequence number: shape (num_seqs, ...).
    """

    batch: int
    seqlen: int
    segments: tuple[Segment, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.segments)

    def token_seq(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(seq, seq_start), each (B, L) int64: the sequence number of every token and the position
        where that sequence starts in its row."""
        seq = torch.empty(self.batch, self.seqlen, dtype=torch.int64)
        start = torch.empty(self.batch, self.seqlen, dtype=torch.int64)
        for s in self.segments:
            seq[s.row, s.start:s.end] = s.seq
            start[s.row, s.start:s.end] = s.start
        return seq, start


def sequence_layout(batch: int, seqlen: int, seq_idx=None, cu_seqlens=None) -> SequenceLayout:
    """Build the :class:`SequenceLayout` for a (batch, seqlen) input; validates seq_idx / cu_seqlens."""
    if seq_idx is not None and cu_seqlens is not None:
        raise ValueError("pass seq_idx or cu_seqlens, not both")
    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"cu_seqlens packs sequences along L and needs B == 1, got B={batch}")
        cu = as_index(cu_seqlens).tolist()
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != seqlen or any(a > b for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to L={seqlen}, got {cu}")
        segments = [Segment(0, a, b, i) for i, (a, b) in enumerate(zip(cu, cu[1:]))]
        return SequenceLayout(batch, seqlen, tuple(segments))
    if seq_idx is None:
        return SequenceLayout(batch, seqlen, tuple(Segment(b, 0, seqlen, b) for b in range(batch)))
    ids = as_index(seq_idx)
    check_shape("seq_idx", ids, (batch, seqlen))
    if seqlen > 1 and bool((ids[:, 1:] < ids[:, :-1]).any()):
        raise ValueError("seq_idx must be non-decreasing along L in every row")
    segments = []
    for b in range(batch):
        starts = [0] + [l for l in range(1, seqlen) if ids[b, l] != ids[b, l - 1]]
        for start, end in zip(starts, starts[1:] + [seqlen]):
            segments.append(Segment(b, start, end, len(segments)))
    return SequenceLayout(batch, seqlen, tuple(segments))
