"""Comparison helpers (BRIEF §5): max-abs error scaled by the reference RMS, NaN/Inf checked first.

``TOLERANCES`` holds the documented bound per precision case; each number is a safety factor above
the worst error *measured* for a CPU emulation of a kernel's precision against the fp64 oracle
(``python -m reference.measure_tolerances``; numbers and method in docs/TOLERANCES.md).
"""
from __future__ import annotations

import torch

from ._common import as_float


def scaled_error(actual, expected) -> float:
    """max|actual - expected| / rms(expected) (plain max-abs error if rms(expected) == 0)."""
    a, e = as_float(actual).detach(), as_float(expected).detach()
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: actual {tuple(a.shape)} vs expected {tuple(e.shape)}")
    if a.numel() == 0:
        return 0.0
    err = (a - e).abs().max().item()
    rms = e.square().mean().sqrt().item()
    return err / rms if rms > 0 else err


def assert_close_scaled(actual, expected, tol: float, name: str) -> float:
    """Assert scaled_error(actual, expected) <= tol; NaN/Inf in either side fails first, by name.

    Returns the scaled error (handy for logging).
    """
    a, e = as_float(actual).detach(), as_float(expected).detach()
    for side, t in (("actual", a), ("expected (reference)", e)):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            first = tuple(torch.nonzero(bad)[0].tolist())
            raise AssertionError(f"{name}: {int(bad.sum())} NaN/Inf values in {side} "
                                 f"(first at index {first}: {t[first].item()})")
    err = scaled_error(a, e)
    if err > tol:
        diff = (a - e).abs()
        where = tuple(torch.nonzero(diff == diff.max())[0].tolist())
        raise AssertionError(f"{name}: scaled error {err:.3e} > tol {tol:.1e} (max |a-e| = {diff.max().item():.3e} "
                             f"at {where}: actual {a[where].item():.6e}, expected {e[where].item():.6e}; "
                             f"rms(expected) = {e.square().mean().sqrt().item():.3e})")
    return err


# Bounds for scaled_error(kernel, fp64 oracle), per precision case and quantity. Each is 2.5x the worst
# error measured for a CPU emulation of that precision (standard, hot and packed inputs, 16 seeds,
# realistic P/N/Q), rounded up to one significant digit; docs/TOLERANCES.md has the measurements.
#   out:    the kernel's output in its I/O dtype (prefill and decode)
#   states: fp32 states -- final_states, chunk_states, and an fp32 state pool after decode
#   grads:  every gradient of ssd_bwd (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states)
TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"out": 5e-4, "states": 2e-4, "grads": 3e-4},   # fp32 I/O, fp32 operands (FFMA)
    "tf32": {"out": 7e-2, "states": 3e-2},                  # fp32 I/O, TF32 tensor-core operands
    "bf16": {"out": 7e-1, "states": 2e-1, "grads": 6e-1},   # bf16 I/O, fp32 state, bf16 MMA operands
    "fp16": {"out": 7e-2, "states": 2e-2, "grads": 8e-2},   # fp16 I/O, fp32 state, fp16 MMA operands
    "pool_bf16": {"out": 2e-1, "states": 6e-2},             # verify on a bf16 pool (bf16 I/O)
    "pool_fp16": {"out": 3e-2, "states": 1e-2},             # verify on an fp16 pool (fp16 I/O)
}
