"""fp64 reference ("oracle") for the Mamba-2 SSD kernels: independent of the kernels, CPU torch only.

Modules (walk them in this order):

- ``_common``      input conversion, rounding, the packed-sequence layout convention
- ``recurrence``   the token-stepping mechanism every sequential reference shares
- ``ssd``          process_dt, chunk_cumsum_reference, ssd_reference (token by token),
                   ssd_chunked_reference (matrix form), ssd_reference_grads (fp64 autograd)
- ``verify``       state-pool verify family: update / snapshot / compact replay (+ WindowRecord)
- ``conv``         causal depthwise conv1d: prefill over packed sequences and the three pool modes
- ``generators``   standard / hot / packed input generators
- ``compare``      scaled_error, assert_close_scaled, TOLERANCES
- ``measure_tolerances``  the CPU measurement behind TOLERANCES (docs/TOLERANCES.md)

Math source: BRIEF §2 (shared/BRIEF.md). Inputs are taken as given (already rounded to what the
kernels see) and upcast to fp64 on the CPU; outputs are fp64 CPU tensors.
"""
from . import generators
from .compare import TOLERANCES, assert_close_scaled, scaled_error
from .conv import (ConvStep, conv1d_compact, conv1d_prefill, conv1d_snapshot, conv1d_update,
                   conv_window)
from .ssd import (SSMStep, chunk_cumsum_reference, chunk_state_positions, process_dt,
                  ssd_chunked_reference, ssd_reference, ssd_reference_grads)
from .verify import (CompactResult, VerifyResult, WindowRecord, ssm_window, verify_compact,
                     verify_snapshot, verify_update)

__all__ = [
    "generators", "TOLERANCES", "assert_close_scaled", "scaled_error",
    "ConvStep", "conv1d_compact", "conv1d_prefill", "conv1d_snapshot", "conv1d_update", "conv_window",
    "SSMStep", "chunk_cumsum_reference", "chunk_state_positions", "process_dt",
    "ssd_chunked_reference", "ssd_reference", "ssd_reference_grads",
    "CompactResult", "VerifyResult", "WindowRecord", "ssm_window", "verify_compact", "verify_snapshot",
    "verify_update",
]
