"""Per-sequence states of the prefill families (ssd_fwd, conv1d_fwd): an initial and a final state per
sequence, given either as (num_seqs, *block) arrays or as pools (num_slots, *block) with a slot index per
sequence, in one state dtype per call; a pool may be read and written in place."""
from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError
from ..validation import expect_dim, expect_dtype, expect_rank, expect_shape, record_strides


def bind_cu_seqlens(params: dict, cu_seqlens, batch: int, rows_name: str) -> int:
    """cu_seqlens (num_seqs + 1,) int32 packing sequences along L of one row (``rows_name``: the array whose
    batch must be 1). Records its strides; returns num_seqs."""
    expect_dtype(cu_seqlens, ("int32",))
    expect_rank(cu_seqlens, 1, "(num_seqs + 1,)")
    if batch != 1:
        raise ShapeError(rows_name, f"{rows_name}: cu_seqlens packs sequences along L and needs batch == 1, got "
                         f"{batch}")
    num_seqs = cu_seqlens.shape[0] - 1
    if num_seqs < 1:
        raise ShapeError("cu_seqlens", "cu_seqlens: needs at least 2 entries (one sequence)")
    expect_dim("cu_seqlens", "num_seqs (dim 0 - 1)", num_seqs)
    record_strides(params, cu_seqlens, ("seq",))
    return num_seqs


def state_dtype(initial_states, final_states, allowed: tuple[str, ...], default: str) -> str:
    """The call's state dtype: that of the state arrays given (one dtype for both), else ``default``."""
    given = [a for a in (initial_states, final_states) if a is not None]
    for arr in given:
        expect_dtype(arr, allowed)
    if len(given) == 2 and given[0].dtype != given[1].dtype:
        raise InvalidArgumentError("final_states", f"final_states: dtype {given[1].dtype} differs from "
                                   f"initial_states' {given[0].dtype} (one state dtype per call)")
    return given[0].dtype if given else default


def bind_sequence_states(params: dict, *, initial_states, initial_state_indices, final_states, final_state_indices,
                         num_seqs: int, block: tuple[int, ...], block_dims: str, stride_dims: tuple[str, ...],
                         check_block=None) -> tuple[list, list]:
    """Check and record both roles: ``<role>_states`` (num_seqs or num_slots, *block) with its
    ``<role>_state_indices`` (num_seqs,) int32 or None (then one row per sequence), the strides named by
    ``stride_dims``, ``num_<role>_slots``, pointers and ``has_*`` flags. ``check_block(arr)`` adds a family's
    own layout rules. Returns (arrays read, arrays written); a pool passed as both is read in place."""
    in_place = (initial_states is not None and final_states is not None
                and _same_array(initial_states, final_states))
    inputs, outputs = [], []
    for role, arr, idx in (("initial", initial_states, initial_state_indices),
                           ("final", final_states, final_state_indices)):
        plural, index_name = f"{role}_states", f"{role}_state_indices"
        params[plural] = params[index_name] = 0
        params[f"has_{plural}"] = int(arr is not None)
        params[f"has_{index_name}"] = int(idx is not None)
        params[f"num_{role}_slots"] = 0
        if arr is None:
            if idx is not None:
                raise InvalidArgumentError(index_name, f"{index_name}: given without {plural}")
            continue
        expect_rank(arr, 1 + len(block), f"(num_seqs or num_slots, {block_dims})")
        slots = arr.shape[0]
        expect_dim(plural, "num_seqs or num_slots (dim 0)", slots)
        expect_shape(arr, (slots, *block), f"(num_seqs or num_slots, {block_dims})")
        if check_block is not None:
            check_block(arr)
        if idx is None:
            expect_shape(arr, (num_seqs, *block), f"(num_seqs, {block_dims})")
        else:
            expect_dtype(idx, ("int32",))
            expect_shape(idx, (num_seqs,), "(num_seqs,)")
            record_strides(params, idx, ("seq",))
            params[index_name] = idx.ptr
            inputs.append(idx)
        record_strides(params, arr, stride_dims)
        params[plural] = arr.ptr
        params[f"num_{role}_slots"] = slots
        if role == "final":
            outputs.append(arr)
        elif not in_place:
            inputs.append(arr)
    return inputs, outputs


def _same_array(a, b) -> bool:
    return (a.ptr, a.shape, a.strides, a.dtype) == (b.ptr, b.shape, b.strides, b.dtype)
