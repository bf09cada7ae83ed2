"""PyTorch drop-ins for state-spaces/mamba's Triton entry points, on the prebuilt kernels.

    from mamba2_aot.torch import (mamba_chunk_scan_combined, selective_state_update, causal_conv1d_fn,
                                  causal_conv1d_update)

Same signatures and return conventions as ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``,
``mamba_ssm.ops.triton.selective_state_update.selective_state_update`` and the ``causal_conv1d`` package's
``causal_conv1d_fn`` / ``causal_conv1d_update`` (which state-spaces/mamba's Mamba-2 block calls); outputs are
allocated with torch and the kernels run on torch's current stream. They are ``torch.library`` custom ops
(``mamba2_aot::ssd_fwd``, ``mamba2_aot::state_update``, ``mamba2_aot::conv1d_fwd``,
``mamba2_aot::conv1d_update``) with fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces
them; for CUDA-graph capture call ``mamba2_aot.preload()`` first (kernels are loaded outside capture).

Importing this module needs torch; the rest of the package never imports it. Errors are the runtime's typed
errors (``mamba2_aot.errors``), raised before anything is launched and naming the drop-in's own arguments (the conv
ops' shapes as the caller passed them, or said to be the transposed view's); under ``torch.compile(fullgraph=True)``
those raised in Python before the ops (an argument not a tensor, a wrong rank or form, an option) come as the
compiler's Unsupported (docs/RUNTIME.md lists them).
``mamba_chunk_scan_combined`` is differentiable: its backward is the custom op ``mamba2_aot::ssd_bwd`` (the
``ssd_bwd`` kernels; bitwise reproducible gradients). Not yet: ``return_final_states`` together with ``seq_idx``
(pass ``cu_seqlens``).
"""
from __future__ import annotations

import re
from typing import Optional

import torch

from . import runtime
from .errors import ArrayProtocolError, DeviceError, DTypeError, InvalidArgumentError, ShapeError, StrideError
from .plans.ssd_fwd import expect_vector_operand
from .tensors import as_device_array
from .validation import expect_int, has_internal_overlap

_STATE_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@torch.library.custom_op("mamba2_aot::ssd_fwd", mutates_args=())
def _ssd_fwd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
             D: Optional[torch.Tensor], z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
             initial_states: Optional[torch.Tensor], initial_state_indices: Optional[torch.Tensor],
             seq_idx: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], dt_softplus: bool, dt_min: float,
             dt_max: float, num_states: int, zero_fill: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, B, C, z = (_rows_of_vectors(t) for t in (x, B, C, z))  # inside the op: torch.compile does not trace it
    # rows outside every cu_seqlens sequence are not written by the kernel: zeros there, as a full scan gives
    out = (torch.zeros if zero_fill else torch.empty)(x.shape, dtype=x.dtype, device=x.device)
    final_states = torch.empty(num_states, x.shape[2], x.shape[3], B.shape[3], dtype=torch.float32, device=x.device)
    # a call with few CTAs, or a wave and a part-empty one, is split along L (plans/ssd_fwd.py), into this workspace
    size = runtime.workspace_size("ssd_fwd", x=x, B=B, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
    runtime.launch("ssd_fwd", x=x, dt=dt, A=A, B=B, C=C, out=out, chunk_size=chunk_size, D=D, z=z, dt_bias=dt_bias,
                   dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max), initial_states=initial_states,
                   initial_state_indices=initial_state_indices, final_states=final_states if num_states else None,
                   seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                   workspace=torch.empty(size // 4, dtype=torch.float32, device=x.device) if size else None)
    return out, final_states


@_ssd_fwd.register_fake
def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens,
      dt_softplus, dt_min, dt_max, num_states, zero_fill):
    return x.new_empty(x.shape), x.new_empty((num_states, x.shape[2], x.shape[3], B.shape[3]), dtype=torch.float32)


@torch.library.custom_op("mamba2_aot::ssd_bwd", mutates_args=())
def _ssd_bwd(dout: torch.Tensor, dfinal_states: Optional[torch.Tensor], x: torch.Tensor, dt: torch.Tensor,
             A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
             dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
             initial_state_indices: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], dt_softplus: bool, dt_min: float, dt_max: float,
             num_seqs: int) -> list[torch.Tensor]:
    """The gradients of ``_ssd_fwd``'s inputs (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states per
    sequence); an absent input's gradient is an empty tensor."""
    grads = _ssd_bwd_outputs(x, dt, A, B, C, D, z, dt_bias, initial_states, num_seqs)
    if x.shape[0] == 0 or x.shape[2] == 0:  # no tokens or no heads: the sums dA, dD, ddt_bias are 0, the rest empty
        for g in grads:
            g.zero_()
        return grads
    x, B, C, z, dout = (_rows_of_vectors(t) for t in (x, B, C, z, dout))
    workspace = torch.empty(runtime.workspace_size("ssd_bwd", x=x, B=B) // 4, dtype=torch.float32, device=x.device)
    runtime.launch("ssd_bwd", x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                   dt_limit=(dt_min, dt_max), initial_states=initial_states, initial_state_indices=initial_state_indices,
                   seq_idx=seq_idx, cu_seqlens=cu_seqlens, dout=dout, dfinal_states=dfinal_states, workspace=workspace,
                   **{name: g for name, g, source in zip(_GRAD_NAMES, grads, (x, dt, A, B, C, D, z, dt_bias,
                                                                             initial_states))
                      if source is not None})
    return grads


_GRAD_NAMES = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states")


def _ssd_bwd_outputs(x, dt, A, B, C, D, z, dt_bias, initial_states, num_seqs):
    def like(t):
        return t.new_empty(t.shape) if t is not None else x.new_empty(0)
    # zeros: the kernel leaves the rows of sequences a seq_idx packing does not contain
    dinitial = (x.new_zeros((num_seqs, x.shape[2], x.shape[3], B.shape[3]), dtype=torch.float32)
                if initial_states is not None else x.new_empty(0))
    return [like(x), like(dt), like(A), like(B), like(C), like(D), like(z), like(dt_bias), dinitial]


@_ssd_bwd.register_fake
def _(dout, dfinal_states, x, dt, A, B, C, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens,
      dt_softplus, dt_min, dt_max, num_seqs):
    return _ssd_bwd_outputs(x, dt, A, B, C, D, z, dt_bias, initial_states, num_seqs)


def _setup_ssd_fwd(ctx, inputs, output):
    (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens,
     dt_softplus, dt_min, dt_max, num_states, zero_fill) = inputs
    ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens)
    ctx.options = (dt_softplus, dt_min, dt_max, num_states)


def _backward_ssd_fwd(ctx, dout, dfinal_states):
    x, dt, A, B, C, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens = ctx.saved_tensors
    dt_softplus, dt_min, dt_max, num_states = ctx.options
    dout = torch.zeros_like(x) if dout is None else dout.contiguous()
    if dfinal_states is not None and num_states:
        dfinal_states = dfinal_states.float().contiguous()
    else:
        dfinal_states = None
    # the per-sequence initial-state gradients (none without initial_states): one per index, else per state
    source = initial_state_indices if initial_state_indices is not None else initial_states
    num_seqs = source.shape[0] if source is not None else 0
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial = _ssd_bwd(
        dout, dfinal_states, x, dt, A, B, C, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens,
        dt_softplus, dt_min, dt_max, num_seqs)
    dinitial_states = None
    if initial_states is not None:
        if initial_state_indices is None:
            dinitial_states = dinitial
        else:  # per-sequence gradients, back to the slots the sequences read
            dinitial_states = torch.zeros_like(initial_states)
            used = initial_state_indices >= 0
            dinitial_states[initial_state_indices[used].long()] += dinitial[used]
    return (dx, ddt, dA, dB, dC, None, dD if D is not None else None, dz if z is not None else None,
            ddt_bias if dt_bias is not None else None, dinitial_states, None, None, None, None, None, None, None, None)


_ssd_fwd.register_autograd(_backward_ssd_fwd, setup_context=_setup_ssd_fwd)


@torch.library.custom_op("mamba2_aot::state_update", mutates_args=("state",))
def _state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                  dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                  state_indices: Optional[torch.Tensor]) -> torch.Tensor:
    state_indices = _slots(state_indices, state, "state", x, "state_batch_indices")
    out = torch.empty_like(x)
    try:
        runtime.launch("verify", mode="update", state=state, x=x, dt=dt, A=A, B=B, C=C, out=out, D=D, z=z,
                       dt_bias=dt_bias, dt_softplus=dt_softplus, state_indices=state_indices)
    except InvalidArgumentError as exc:
        _raise_in_caller_terms(exc, _DECODE_NAMES)
        raise
    return out


@_state_update.register_fake
def _(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices):
    return torch.empty_like(x)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, state_dtype=None):
    """The Mamba-2 chunked SSD forward (BRIEF §2), as state-spaces/mamba's function of the same name.

    x (batch, L, H, P) bf16/fp16; dt (batch, L, H) in x's dtype; A (H,) (<= 0); B, C (batch, L, G, N);
    D (H,) or (H, P); z like x; dt_bias (H,) (A, D, dt_bias are used in fp32); initial_states (batch, H, P, N);
    seq_idx (batch, L) and cu_seqlens (num_seqs + 1,) int32 (other integer dtypes are converted); chunk_size 64,
    128 or 256.

    Returns ``out`` (batch, L, H, P), then ``final_states`` (batch, H, P, N) fp32 if return_final_states, then
    ``varlen_states`` (num_seqs, H, P, N) in ``state_dtype`` (default C's dtype) if return_varlen_states (needs
    cu_seqlens, batch 1), as state-spaces/mamba returns them. The states are computed in fp32 whatever
    ``state_dtype``. cu_seqlens packs the sequences when return_varlen_states is set, or when seq_idx is given
    too with batch 1 (both must describe the same sequences); otherwise, as in state-spaces/mamba, it is
    ignored and seq_idx packs, with a state reset at each change. ``initial_states`` is each row's first
    sequence's initial state; with cu_seqlens it may also be (num_seqs, H, P, N), one per sequence.
    Not supported (typed errors): ``initial_states`` or ``return_final_states`` with seq_idx packing and no
    cu_seqlens when batch > 1 / at all (the sequence count is on the device).

    Differentiable (autograd through ``ssd_bwd``, deterministic) in every input that takes a gradient, and in
    ``out`` and ``final_states``; ``varlen_states`` is returned as a converted copy and carries gradients too.

    Raises (before anything launches) the runtime's typed errors naming the argument: ArrayProtocolError (not a
    torch tensor), DeviceError (not on a CUDA device), ShapeError, DTypeError, StrideError, AlignmentError,
    InvalidArgumentError (an option, a combination); VariantNotFoundError for a shape or dtype not built.
    """
    _expect_tensors(x=x, dt=dt, A=A, B=B, C=C)
    _expect_optional_tensors(D=D, z=z, dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
                             cu_seqlens=cu_seqlens)
    # (their dims are read here: they size the outputs, count the sequences)
    _expect_rank("x", x, {4: "(batch, seqlen, nheads, headdim)"})
    _expect_rank("B", B, {4: "(batch, seqlen, ngroups, d_state)"})
    if cu_seqlens is not None:
        _expect_rank("cu_seqlens", cu_seqlens, {1: "(num_seqs + 1,)"})
    if initial_states is not None:
        _expect_rank("initial_states", initial_states, {4: "(batch or num_seqs, nheads, headdim, d_state)"})
    if return_varlen_states and cu_seqlens is None:
        raise InvalidArgumentError("cu_seqlens", "cu_seqlens: required with return_varlen_states=True")
    varlen_dtype = C.dtype if state_dtype is None else state_dtype
    if varlen_dtype not in _STATE_DTYPES:
        raise InvalidArgumentError("state_dtype", f"state_dtype: expected one of {list(_STATE_DTYPES)}, got "
                                   f"{state_dtype}")
    # Only the forms are checked here; the values are the runtime's to check, inside the op, where a refusal keeps its
    # type under torch.compile(fullgraph=True) (one raised while tracing becomes the compiler's Unsupported).
    chunk_size = expect_int("chunk_size", chunk_size, minimum=-2**63, maximum=2**63 - 1)
    lo, hi = _pair_of_floats("dt_limit", dt_limit)
    seq_idx, cu_seqlens = _int32_indices(seq_idx, saturate=False), _int32_indices(cu_seqlens, saturate=True)
    packed_by_cu = cu_seqlens is not None and (return_varlen_states or (seq_idx is not None and x.shape[0] == 1))
    cu_seqlens = cu_seqlens if packed_by_cu else None
    initial_state_indices = None
    if initial_states is not None:
        initial_states = initial_states.float()
    if packed_by_cu:
        seq_idx = None  # the kernel packs by cu_seqlens
        num_seqs = cu_seqlens.shape[0] - 1
        if initial_states is not None and initial_states.shape[0] != num_seqs:
            if initial_states.shape[0] != 1:
                raise ShapeError("initial_states", f"initial_states: expected 1 (the row's) or num_seqs = {num_seqs} "
                                 f"states with cu_seqlens, got {tuple(initial_states.shape)}")
            # the row's state starts the first sequence; the others start from zero
            initial_state_indices = torch.full((num_seqs,), -1, dtype=torch.int32, device=x.device)
            initial_state_indices[0] = 0
        num_states = num_seqs if (return_final_states or return_varlen_states) else 0
    elif seq_idx is not None:
        if return_final_states:
            raise InvalidArgumentError("return_final_states", "return_final_states: not supported with seq_idx "
                                       "packing alone (the number of sequences is on the device); pass "
                                       "cu_seqlens too (batch 1)")
        if initial_states is not None and x.shape[0] != 1:
            raise InvalidArgumentError("initial_states", "initial_states: with seq_idx packing only for batch 1 "
                                       "(or pass cu_seqlens)")
        num_states = 0
    else:
        num_states = x.shape[0] if return_final_states else 0
    out, finals = _ssd_fwd(x, dt, A.float(), B, C, chunk_size, _fp32(D), z, _fp32(dt_bias), initial_states,
                           initial_state_indices, seq_idx, cu_seqlens, bool(dt_softplus), lo, hi, num_states,
                           packed_by_cu)
    result = [out]
    if return_final_states:
        result.append(finals[-1:] if packed_by_cu else finals)  # a row's final state: its last sequence's
    if return_varlen_states:
        result.append(finals.to(varlen_dtype))
    return result[0] if len(result) == 1 else tuple(result)


def _fp32(t):
    return None if t is None else t.float()


def _rows_of_vectors(t):
    """``t`` itself when the kernels can read it with 16-byte vectors (``plans.ssd_fwd.expect_vector_operand``: a
    contiguous last dim among them), else a contiguous copy (as state-spaces/mamba copies a tensor whose last dim is
    strided)."""
    if t is None:
        return None
    try:
        expect_vector_operand(as_device_array(t, "t"))
        return t
    except InvalidArgumentError:
        return t.contiguous()


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    """One decode step on a state pool, in place (BRIEF §2 "verify", update mode with T = 1), as
    state-spaces/mamba's function of the same name.

    state (batch or num_slots, H, P, N) fp32/bf16/fp16; x (batch, H, P) bf16/fp16/fp32; dt (batch, H, P) in x's
    dtype with stride 0 along P (Mamba-2's tied dt, as ``dt[..., None].expand``) or (batch, H); A (H, P, N) tied
    (strides 0 along P, N) or (H,); B, C (batch, G, N) in x's dtype; D (H, P) or (H,); z like x; dt_bias (H, P)
    tied or (H,) (A, D, dt_bias are used in fp32); state_batch_indices (batch,) integers (default: row b uses
    slot b; negative: a padding row, output zero). The 3-dim forms without a head dim work too (one head); x, z, B
    and C may drop their head / group dim on their own, as upstream allows, while dt, A, D and dt_bias take the forms
    of the state's rank. Returns out (batch, H, P) (or (batch, P)). Per-dim (untied) A, dt or dt_bias are Mamba-1
    and not supported: InvalidArgumentError. Other errors: as :func:`mamba_chunk_scan_combined`'s.
    """
    _expect_tensors(state=state, x=x, dt=dt, A=A, B=B, C=C)
    _expect_optional_tensors(D=D, z=z, dt_bias=dt_bias, state_batch_indices=state_batch_indices)
    _expect_rank("state", state, {3: "(batch or num_slots, dim, d_state)",
                                  4: "(batch or num_slots, nheads, headdim, d_state)"})
    has_heads = state.dim() > 3
    # as state-spaces/mamba: x, z, B and C without their head / group dim (one head, one group) each get one
    x, z, B, C = (t.unsqueeze(1) if t is not None and t.dim() == 2 else t for t in (x, z, B, C))
    for name, t, dims in (("x", x, "(batch, nheads, headdim)"), ("z", z, "(batch, nheads, headdim)"),
                          ("B", B, "(batch, ngroups, d_state)"), ("C", C, "(batch, ngroups, d_state)")):
        if t is not None:
            _expect_rank(name, t, {3: f"{dims}, or without its middle dim"})
    if not has_heads:
        state, dt = state.unsqueeze(1), dt.unsqueeze(1)
        A = A.unsqueeze(0) if A.dim() == 2 else A
        D = None if D is None else D.unsqueeze(0)
        dt_bias = None if dt_bias is None else dt_bias.unsqueeze(0)
    A = _per_head("A", A, rank=1, expanded=2)                                             # (H, P, N) -> (H,)
    dt = _per_head("dt", dt, rank=2, expanded=1)                                          # (batch, H, P) -> (batch, H)
    dt_bias = None if dt_bias is None else _per_head("dt_bias", dt_bias, rank=1, expanded=1)  # (H, P) -> (H,)
    if D is not None and D.dim() == 2 and D.stride(-1) == 0:
        D = D[:, 0]
    out = _state_update(state, x[:, None], dt[:, None], A.float(), B[:, None], C[:, None], _fp32(D),
                        None if z is None else z[:, None], _fp32(dt_bias), bool(dt_softplus),
                        _int32_indices(state_batch_indices, saturate=True))[:, 0]
    return out if has_heads else out[:, 0]


def _per_head(name: str, t: torch.Tensor, rank: int, expanded: int) -> torch.Tensor:
    """Mamba-2's per-head value (a tensor of ``rank`` dims), given as is or expanded over ``expanded`` trailing
    dims (P[, N]) with stride 0, as state-spaces/mamba's callers pass A, dt and dt_bias."""
    if t.dim() == rank:
        return t
    if t.dim() != rank + expanded:
        raise ShapeError(name, f"{name}: expected {rank + expanded} dims (expanded per head) or the per-head "
                         f"form, got shape {tuple(t.shape)}")
    if any(s != 0 for s in t.stride()[rank:]):
        raise InvalidArgumentError(name, f"{name}: only Mamba-2's per-head values are supported (expanded with "
                                   f"stride 0 over the trailing dims), got strides {t.stride()}")
    return t[(slice(None),) * rank + (0,) * expanded]


# the runtime's names for the drop-ins' arguments ({runtime's: caller's}); it reads the conv's x (batch, dim, L) as
# its (batch, L, dim) view
_CONV_NAMES = {"xBC": "x", "conv_weight": "weight", "conv_bias": "bias"}
_CONV_UPDATE_NAMES = {**_CONV_NAMES, "state_indices": "conv_state_indices"}
_DECODE_NAMES = {"state_indices": "state_batch_indices"}
_TRANSPOSED = {"x": "x.transpose(1, 2), the (batch, L, dim) view the kernel reads"}


def _raise_in_caller_terms(exc: InvalidArgumentError, names: dict[str, str]) -> None:
    """Raise the runtime's argument error ``exc`` again under the drop-in's argument ``names``, so that it names what
    the caller passed (a shape or stride of a transposed view says so); return when it names none of them. (Called
    from an ``except`` around the launch, which costs the launch path nothing, unlike a context manager.)"""
    words = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    message = words.sub(lambda m: names[m[1]], str(exc))   # (another argument's message may name one too)
    caller = names.get(exc.argument, exc.argument)
    if message == str(exc) and caller == exc.argument:
        return
    if caller in _TRANSPOSED and isinstance(exc, (ShapeError, StrideError)):
        message += f" (of {_TRANSPOSED[caller]})"
    raise type(exc)(caller, message) from exc


_INT32 = torch.iinfo(torch.int32)


def _int32_indices(t: Optional[torch.Tensor], *, saturate: bool) -> Optional[torch.Tensor]:
    """Index tensors as the kernels read them: other integer dtypes (int64 is torch's default) converted to int32.
    ``saturate`` for slots and offsets (state / conv state indices, cu_seqlens): int64 beyond int32 clamps, so it stays
    out of range (a slot past the pool's end or a negative one: a padding row; a cu_seqlens entry past L, which the
    kernels clamp to L) and is never wrapped onto a valid one. Not for seq_idx, labels the kernels only compare with
    their neighbours: clamping would merge two large ones, and the cast keeps neighbours apart unless they differ by
    a multiple of 2^32. Unsigned ones saturate the same way (uint32's and uint64's large values would otherwise wrap
    negative or onto a small slot). Floating-point and bool ones are left for the runtime to refuse, rather than
    rounded."""
    if t is None or t.dtype in (torch.int32, torch.bool) or t.dtype.is_floating_point or t.dtype.is_complex:
        return t
    if saturate and t.dtype in (torch.int64, torch.uint32, torch.uint64):
        wide = t.to(torch.int64)        # (torch clamps no uint32 / uint64 tensor)
        if t.dtype == torch.uint64:     # values of 2^63 and more came out negative
            wide = torch.where(wide < 0, _INT32.max, wide)
        t = wide.clamp(_INT32.min, _INT32.max)
    return t.to(torch.int32)


def _slots(indices: Optional[torch.Tensor], pool: torch.Tensor, pool_name: str, x: torch.Tensor,
           indices_name: str) -> torch.Tensor:
    """Each row's pool slot: the caller's ``indices``, or by default row b's slot b, which the pool must then have
    (a slot past its end would be a padding row, output zero without a word). Inside the ops, where a refusal keeps
    its type under torch.compile(fullgraph=True)."""
    if indices is not None:
        return indices
    if pool.shape[0] < x.shape[0]:
        raise ShapeError(pool_name, f"{pool_name}: {pool.shape[0]} slots for a batch of {x.shape[0]} (row b updates "
                         f"slot b unless {indices_name} says otherwise)")
    return torch.arange(x.shape[0], dtype=torch.int32, device=x.device)


def _pair_of_floats(name: str, value) -> tuple[float, float]:
    """``value`` as (lo, hi) floats for an op's float arguments (whether they make sense is the runtime's check)."""
    try:
        lo, hi = value
        return float(lo), float(hi)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, f"{name}: expected a pair (lo, hi), got {value!r}") from None


def _expect_tensors(**tensors) -> None:
    """An ArrayProtocolError naming the first of ``tensors`` (the drop-in's required tensor arguments) that is not a
    torch tensor (None included), before the drop-in reads its shape."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ArrayProtocolError(name, f"{name}: expected a torch tensor, got {type(t).__name__}")


def _expect_optional_tensors(**tensors) -> None:
    """As :func:`_expect_tensors`, for optional arguments: None is allowed."""
    _expect_tensors(**{name: t for name, t in tensors.items() if t is not None})


def _expect_rank(name: str, t: torch.Tensor, layouts: dict[int, str]) -> None:
    """A ShapeError in the caller's terms unless ``t`` has one of ``layouts``' ranks (rank -> its dims' names)."""
    if t.dim() not in layouts:
        raise ShapeError(name, f"{name}: expected {' or '.join(layouts.values())}, got shape {tuple(t.shape)}")


def _expect_final_states_out(final_states_out, x, weight, return_final_states) -> None:
    """``final_states_out`` can take the final states: checked inside the op before the launch (the states are copied
    into it after)."""
    if not return_final_states:
        raise InvalidArgumentError("final_states_out", "final_states_out: given without return_final_states=True")
    expected = (x.shape[0], x.shape[1], weight.shape[1] - 1)
    if tuple(final_states_out.shape) != expected:
        raise ShapeError("final_states_out", f"final_states_out: expected shape {expected} (batch, dim, width - 1), "
                         f"got {tuple(final_states_out.shape)}")
    if final_states_out.dtype != x.dtype:
        raise DTypeError("final_states_out", f"final_states_out: expected x's dtype {x.dtype}, got "
                         f"{final_states_out.dtype}")
    if final_states_out.device != x.device:
        raise DeviceError("final_states_out", f"final_states_out: expected x's device {x.device}, got "
                          f"{final_states_out.device}")
    if has_internal_overlap(tuple(final_states_out.shape), final_states_out.stride()):
        raise StrideError("final_states_out", f"final_states_out: its elements overlap (strides "
                          f"{final_states_out.stride()}): it cannot hold a state per row")


@torch.library.custom_op("mamba2_aot::conv1d_fwd", mutates_args=("final_states_out",))
def _conv1d_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
                initial_states: Optional[torch.Tensor], silu: bool, return_final_states: bool,
                final_states_out: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    # x (batch, dim, L) as the causal_conv1d package takes it; the kernel reads (batch, L, dim) views
    if seq_idx is not None and (initial_states is not None or return_final_states):
        name = "initial_states" if initial_states is not None else "return_final_states"
        raise InvalidArgumentError(name, f"{name}: not supported with seq_idx (nor in the causal_conv1d package)")
    if final_states_out is not None:
        _expect_final_states_out(final_states_out, x, weight, return_final_states)
    out = torch.empty_like(x)
    width = weight.shape[1]
    final_states = x.new_empty((x.shape[0] if return_final_states else 0, x.shape[1], width - 1))
    try:
        runtime.launch("conv1d_fwd", xBC=x.transpose(1, 2), conv_weight=weight, conv_bias=bias,
                       out=out.transpose(1, 2), activation="silu" if silu else None, seq_idx=seq_idx,
                       initial_states=initial_states, final_states=final_states if return_final_states else None)
    except InvalidArgumentError as exc:
        _raise_in_caller_terms(exc, _CONV_NAMES)
        raise
    if final_states_out is not None:
        final_states_out.copy_(final_states)
    return out, final_states


@_conv1d_fwd.register_fake
def _(x, weight, bias, seq_idx, initial_states, silu, return_final_states, final_states_out):
    return torch.empty_like(x), x.new_empty((x.shape[0] if return_final_states else 0, x.shape[1], weight.shape[1] - 1))


@torch.library.custom_op("mamba2_aot::conv1d_update", mutates_args=("conv_state",))
def _conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   silu: bool, state_indices: Optional[torch.Tensor]) -> torch.Tensor:
    state_indices = _slots(state_indices, conv_state, "conv_state", x, "conv_state_indices")
    out = torch.empty_like(x)   # (batch, dim, T)
    try:
        runtime.launch("conv1d_verify", mode="update", conv_state=conv_state, xBC=x.transpose(1, 2),
                       conv_weight=weight, conv_bias=bias, out=out.transpose(1, 2),
                       activation="silu" if silu else None, state_indices=state_indices)
    except InvalidArgumentError as exc:
        _raise_in_caller_terms(exc, _CONV_UPDATE_NAMES)
        raise
    return out


@_conv1d_update.register_fake
def _(x, conv_state, weight, bias, silu, state_indices):
    return torch.empty_like(x)


_ACTIVATIONS = {None: False, "silu": True, "swish": True}


def _conv_activation(activation) -> bool:
    if activation not in _ACTIVATIONS:
        raise InvalidArgumentError("activation", f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return _ACTIVATIONS[activation]


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """The causal depthwise conv1d over sequences (the prefill before the SSM), as the ``causal_conv1d``
    package's function of the same name (math: kernel_src/conv_window.py).

    x (batch, dim, L) bf16/fp16/fp32, any strides (Mamba-2 passes ``xBC.transpose(1, 2)``, channels contiguous:
    the fast layout); weight (dim, width) with width 2..4 and bias (dim,) (used in fp32); seq_idx (batch, L)
    int32 (other integer dtypes are converted; a new sequence where it changes; no states with it);
    initial_states (batch, dim, width - 1) (taken in x's dtype); activation None, "silu" or "swish". Returns out
    (batch, dim, L) in x's dtype, and with return_final_states also final_states (batch, dim, width - 1) in x's
    dtype (written into ``final_states_out`` when given). Errors: as :func:`mamba_chunk_scan_combined`'s.
    """
    silu = _conv_activation(activation)
    _expect_tensors(x=x, weight=weight)
    _expect_optional_tensors(bias=bias, seq_idx=seq_idx, initial_states=initial_states,
                             final_states_out=final_states_out)
    _expect_rank("x", x, {3: "(batch, dim, L)"})
    _expect_rank("weight", weight, {2: "(dim, width)"})
    initial_states = None if initial_states is None else initial_states.to(x.dtype)   # one state dtype: x's
    out, finals = _conv1d_fwd(x, weight.float(), _fp32(bias), _int32_indices(seq_idx, saturate=False), initial_states,
                              silu, bool(return_final_states), final_states_out)
    if not return_final_states:
        return out
    return out, finals if final_states_out is None else final_states_out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """T new columns of the causal conv1d from a conv-state pool, in place (decode), as the ``causal_conv1d``
    package's function of the same name.

    x (batch, dim) or (batch, dim, T); conv_state (batch or num_slots, dim, state_len >= width - 1) in x's dtype
    or fp32, updated in place: its last width - 1 columns, the only ones the conv reads (state-spaces/mamba's
    cache has state_len = width; the columns before are left as they were); weight (dim, width), width 2..4;
    bias (dim,); conv_state_indices (batch,) integers (row b uses that slot; negative: a padding row, output zero;
    default: slot b). Returns out shaped like x. Not supported (typed error): ``cache_seqlens`` (a circular state).
    Other errors: as :func:`mamba_chunk_scan_combined`'s.
    """
    silu = _conv_activation(activation)
    if cache_seqlens is not None:
        raise InvalidArgumentError("cache_seqlens", "cache_seqlens: the circular conv state is not supported; keep "
                                   "the state as the last width - 1 inputs")
    _expect_tensors(x=x, conv_state=conv_state, weight=weight)
    _expect_optional_tensors(bias=bias, conv_state_indices=conv_state_indices)
    _expect_rank("x", x, {2: "(batch, dim)", 3: "(batch, dim, T)"})
    _expect_rank("conv_state", conv_state, {3: "(batch or num_slots, dim, state_len)"})
    _expect_rank("weight", weight, {2: "(dim, width)"})
    if conv_state.shape[1] != x.shape[1]:
        raise ShapeError("conv_state", f"conv_state: expected (batch or num_slots, dim = {x.shape[1]} as x, "
                         f"state_len), got shape {tuple(conv_state.shape)}")
    held = weight.shape[1] - 1
    if conv_state.shape[2] < held:
        raise ShapeError("conv_state", f"conv_state: state length {conv_state.shape[2]} is shorter than width - 1 = "
                         f"{held}")
    if conv_state.shape[2] > held:
        # state-spaces/mamba's inference cache holds d_conv columns; the conv reads only the last width - 1
        conv_state = conv_state[..., -held:]
    single = x.dim() == 2
    rows = x[..., None] if single else x
    out = _conv1d_update(rows, conv_state, weight.float(), _fp32(bias), silu,
                         _int32_indices(conv_state_indices, saturate=True))
    return out[..., 0] if single else out


__all__ = ["mamba_chunk_scan_combined", "selective_state_update", "causal_conv1d_fn", "causal_conv1d_update"]
