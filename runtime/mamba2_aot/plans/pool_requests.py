"""The per-request metadata every state-pool family takes (verify, conv1d_verify): slot indices, the snapshot
targets of snapshot mode, the accepted counts of compact mode, and the optional rejected-index counter."""
from __future__ import annotations

from ..validation import expect_dtype, expect_shape, record_strides


def bind_requests(params: dict, mode: str, *, batch: int, seqlen: int, state_indices, snapshot_indices, num_accepted,
                  rejected) -> tuple[list, list]:
    """state_indices (batch,) int32; snapshot_indices (batch, T) int32 in snapshot mode; num_accepted (batch,)
    int32 in compact mode; rejected (1,) int32 or None. Records pointers, strides and ``has_rejected``; returns
    (arrays read, arrays written). The mode's required arrays have been checked present."""
    expect_dtype(state_indices, ("int32",))
    expect_shape(state_indices, (batch,), "(batch,)")
    params["state_indices"] = state_indices.ptr
    record_strides(params, state_indices, ("batch",))
    inputs, outputs = [state_indices], []
    params["has_rejected"] = int(rejected is not None)
    if rejected is not None:
        expect_dtype(rejected, ("int32",))
        expect_shape(rejected, (1,), "(one int32 counter)")
        params["rejected"] = rejected.ptr
        outputs.append(rejected)
    if mode == "snapshot":
        expect_dtype(snapshot_indices, ("int32",))
        expect_shape(snapshot_indices, (batch, seqlen), "(batch, T)")
        record_strides(params, snapshot_indices, ("batch", "seqlen"))
        params["snapshot_indices"] = snapshot_indices.ptr
        inputs.append(snapshot_indices)
    if mode == "compact":
        expect_dtype(num_accepted, ("int32",))
        expect_shape(num_accepted, (batch,), "(batch,)")
        record_strides(params, num_accepted, ("batch",))
        params["num_accepted"] = num_accepted.ptr
        inputs.append(num_accepted)
    return inputs, outputs
