"""fp64 references for the verify family on a state pool (BRIEF §2 "verify"): update, snapshot and
compact replay, for the SSM (this module) and the causal conv1d (``reference.conv``).

All three modes drive the same ``recurrence.Step`` through :func:`recurrence.run_rows`, so the only
thing that differs between them is which states are read and written.

Pool conventions (shared by every function here):

- ``pool`` (num_slots, *state_shape), any float dtype; read as-is, math in ``compute_dtype`` (fp64
  for the oracle; fp32 only to emulate a kernel). ``pool_dtype`` (bf16 / fp16 / fp32; None = no
  rounding): the carried state is rounded to it after *every* token, i.e. it is always a value the
  pool can hold. This is the one convention under which all three BRIEF properties hold for every
  pool dtype: T single-token updates == one T-token update, snapshot t == the state an update of
  t+1 tokens stores, and compact replay == snapshot mode, bit for bit.
- Functional: inputs are never modified; the returned pool (fp64) is a new tensor.
- ``state_indices[b] < 0``: padding row -- nothing read, nothing written (no snapshots either),
  its outputs are zero. ``state_indices[b] >= num_slots``: treated exactly as padding, and flagged in
  the result's ``out_of_range`` (so a kernel's "count invalid rows" can be checked against it).
- Rows are applied in order b = 0..Bt-1 and every source state is read from the *input* pool: callers
  must not alias slots across rows (a kernel would race); the oracle's answer for that is undefined.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ._common import FP64, as_float, as_index, check_shape, round_to
from .recurrence import Step, run_rows
from .ssd import DEFAULT_DT_LIMIT, SSMStep, ssm_inputs


class VerifyResult(NamedTuple):
    out: torch.Tensor            # (Bt, T, ...) fp64; zero on padding rows
    pool: torch.Tensor           # (num_slots, ...) fp64, new tensor
    out_of_range: torch.Tensor   # (Bt,) bool: state_indices[b] >= num_slots (treated as padding)


class CompactResult(NamedTuple):
    out: torch.Tensor
    pool: torch.Tensor
    window: "WindowRecord"
    out_of_range: torch.Tensor
    accepted_clamped: torch.Tensor  # (Bt,) bool: num_accepted[b] was outside 0..k and was clamped


@dataclass(frozen=True)
class WindowRecord:
    """Compact-replay pending windows, one per pool slot (BRIEF §2 "compact replay").

    count: (num_slots,) int64, the number k of pending rows of each slot.
    rows: name -> (num_slots, capacity, *row_shape) fp64, the raw per-row inputs of the pending window
    (for the SSM: x (H, P), B (G, N), raw dt (H); for the conv: xBC (channels)) -- exactly the step's
    ``window_keys``. Rows at index >= count are zero.
    """

    count: torch.Tensor
    rows: dict

    @property
    def capacity(self) -> int:
        return next(iter(self.rows.values())).shape[1]

    @classmethod
    def empty(cls, num_slots: int, capacity: int, **row_shapes) -> "WindowRecord":
        """No pending rows; e.g. ``WindowRecord.empty(8, 16, x=(H, P), B=(G, N), dt=(H,))``."""
        return cls(torch.zeros(num_slots, dtype=torch.int64),
                   {k: torch.zeros(num_slots, capacity, *shape, dtype=FP64) for k, shape in row_shapes.items()})


@dataclass(frozen=True)
class _PoolStep:
    """``step`` whose carried state is rounded to the pool dtype after every token (module doc)."""

    step: Step
    pool_dtype: torch.dtype | None

    @property
    def window_keys(self):
        return self.step.window_keys

    @property
    def out_key(self):
        return self.step.out_key

    def advance(self, state, row):
        return round_to(self.step.advance(state, row), self.pool_dtype)

    def output(self, state_before, state_after, row):
        return self.step.output(state_before, state_after, row)


def _slots(state_indices, batch: int, num_slots: int):
    """[(b, slot)] for the rows that run, and the (Bt,) out-of-range flags."""
    idx = as_index(state_indices)
    check_shape("state_indices", idx, (batch,))
    out_of_range = idx >= num_slots
    return [(b, int(s)) for b, s in enumerate(idx.tolist()) if 0 <= s < num_slots], out_of_range


def run_verify(step: Step, pool, state_indices, rows: dict, *, snapshot_indices=None, write_final: bool,
               pool_dtype=None, compute_dtype=FP64) -> VerifyResult:
    """Update / snapshot driver. rows: name -> (Bt, T, ...) in compute_dtype.

    For every non-padding row b: run the T rows from ``pool[state_indices[b]]``; after row t store the
    state to ``snapshot_indices[b, t]`` if that is a valid slot (negative or >= num_slots: not written);
    if ``write_final``, store the state after the last row back to ``state_indices[b]``.
    """
    step = _PoolStep(step, pool_dtype)
    pool = as_float(pool)
    new_pool = pool.clone()
    out = torch.zeros(rows[step.out_key].shape, dtype=FP64)
    batch, T = out.shape[:2]
    runs, out_of_range = _slots(state_indices, batch, pool.shape[0])
    snaps = None
    if snapshot_indices is not None:
        snaps = as_index(snapshot_indices)
        check_shape("snapshot_indices", snaps, (batch, T))
    for b, slot in runs:
        def snapshot(t, state, b=b):
            target = int(snaps[b, t])
            if 0 <= target < pool.shape[0]:
                new_pool[target] = state.to(FP64)

        outputs, final = run_rows(step, pool[slot].to(compute_dtype), {k: v[b] for k, v in rows.items()},
                                  on_state=snapshot if snaps is not None else None)
        if T:
            out[b] = torch.stack(outputs)
        if write_final and T:
            new_pool[slot] = final.to(FP64)
    return VerifyResult(out, new_pool, out_of_range)


def run_compact(step: Step, pool, window: WindowRecord, state_indices, num_accepted, rows: dict, *,
                pool_dtype=None, compute_dtype=FP64) -> CompactResult:
    """Compact-replay driver. rows: name -> (Bt, T, ...) in compute_dtype, T <= window.capacity.

    For every non-padding row b with slot s and k = window.count[s] pending rows:
      1. a = clamp(num_accepted[b], 0, k); if a > 0, replay the first a pending rows from pool[s] and
         store the result into pool[s] -- the committed state;
      2. run the T new rows from that state, emitting outputs, writing no state;
      3. the T new raw rows become slot s's pending window (count = T).
    Outputs and committed states equal snapshot mode's bit for bit (same steps, same roundings).
    """
    step = _PoolStep(step, pool_dtype)
    pool = as_float(pool)
    new_pool = pool.clone()
    count = window.count.clone()
    pending = {k: v.clone() for k, v in window.rows.items()}
    out = torch.zeros(rows[step.out_key].shape, dtype=FP64)
    batch, T = out.shape[:2]
    if T > window.capacity:
        raise ValueError(f"T={T} new rows do not fit the window capacity {window.capacity}")
    runs, out_of_range = _slots(state_indices, batch, pool.shape[0])
    accepted = as_index(num_accepted)
    check_shape("num_accepted", accepted, (batch,))
    clamped = torch.zeros(batch, dtype=torch.bool)
    for b, slot in runs:
        fold = min(max(int(accepted[b]), 0), int(window.count[slot]))
        clamped[b] = fold != int(accepted[b])
        if fold:
            replay = {key: window.rows[key][slot, :fold].to(compute_dtype) for key in step.window_keys}
            _, committed = run_rows(step, pool[slot].to(compute_dtype), replay, emit=False)
            new_pool[slot] = committed.to(FP64)
        outputs, _ = run_rows(step, new_pool[slot].to(compute_dtype), {key: v[b] for key, v in rows.items()})
        if T:
            out[b] = torch.stack(outputs)
        count[slot] = T
        for key in step.window_keys:
            pending[key][slot] = 0
            pending[key][slot, :T] = rows[key][b].to(FP64)
    return CompactResult(out, new_pool, WindowRecord(count, pending), out_of_range, clamped)


def _ssm(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, compute_dtype, pool):
    """Validate verify inputs; return (SSMStep, rows)."""
    x, dt, A, B, C, D, z, dt_bias = ssm_inputs(x, dt, A, B, C, D, z, dt_bias, compute_dtype)
    _, _, nheads, headdim = x.shape
    check_shape("state_pool", pool, (pool.shape[0], nheads, headdim, B.shape[3]))
    rows = {"x": x, "dt": dt, "B": B, "C": C}
    if z is not None:
        rows["z"] = z
    return SSMStep(A, dt_bias, dt_softplus, tuple(dt_limit), D), rows


def verify_update(state_pool, state_indices, x, dt, A, B, C, *, D=None, z=None, dt_bias=None,
                  dt_softplus=False, dt_limit=DEFAULT_DT_LIMIT, pool_dtype=None,
                  compute_dtype=FP64) -> VerifyResult:
    """Update mode: run T steps from ``pool[state_indices[b]]``, emit y per step, write the final state back.

    state_pool (num_slots, H, P, N); state_indices (Bt,) int32; x, z (Bt, T, H, P); dt (Bt, T, H) raw;
    A (H); B, C (Bt, T, G, N); D (H) or (H, P); dt_bias (H). T = 1 is plain decode.
    Returns :class:`VerifyResult` (out (Bt, T, H, P), pool, out_of_range). Pool conventions: module doc.
    """
    step, rows = _ssm(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, compute_dtype, state_pool)
    return run_verify(step, state_pool, state_indices, rows, write_final=True, pool_dtype=pool_dtype,
                      compute_dtype=compute_dtype)


def verify_snapshot(state_pool, state_indices, x, dt, A, B, C, *, snapshot_indices, D=None, z=None,
                    dt_bias=None, dt_softplus=False, dt_limit=DEFAULT_DT_LIMIT, pool_dtype=None,
                    compute_dtype=FP64) -> VerifyResult:
    """Snapshot mode: as :func:`verify_update`, but after step t the state goes to slot
    ``snapshot_indices[b, t]`` ((Bt, T) int32; negative or out of range = not written) and the source
    slot is not written unless named there."""
    step, rows = _ssm(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, compute_dtype, state_pool)
    return run_verify(step, state_pool, state_indices, rows, snapshot_indices=snapshot_indices,
                      write_final=False, pool_dtype=pool_dtype, compute_dtype=compute_dtype)


def verify_compact(state_pool, window, state_indices, x, dt, A, B, C, *, num_accepted, D=None, z=None,
                   dt_bias=None, dt_softplus=False, dt_limit=DEFAULT_DT_LIMIT, pool_dtype=None,
                   compute_dtype=FP64) -> CompactResult:
    """Compact replay: fold the first ``num_accepted[b]`` pending rows of the slot's window into the
    slot, run the T new rows from it, and keep them as the new pending window (:func:`run_compact`).

    window: :class:`WindowRecord` with rows x (H, P), B (G, N), dt (H) -- see :func:`ssm_window`.
    num_accepted (Bt,) int32, clamped to 0..k (flagged in ``accepted_clamped``).
    """
    step, rows = _ssm(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, compute_dtype, state_pool)
    return run_compact(step, state_pool, window, state_indices, num_accepted, rows,
                       pool_dtype=pool_dtype, compute_dtype=compute_dtype)


def ssm_window(num_slots: int, capacity: int, nheads: int, headdim: int, ngroups: int, dstate: int):
    """An empty SSM :class:`WindowRecord` (x (H, P), B (G, N), dt (H) per row)."""
    return WindowRecord.empty(num_slots, capacity, x=(nheads, headdim), B=(ngroups, dstate), dt=(nheads,))
