"""fp64 references for the Mamba-2 SSD (BRIEF §2): token-by-token and chunked matrix form.

Math source: BRIEF §2 (the recurrence every family implements); the chunked form follows the SSD
paper (Dao & Gu 2024, "Transformers are SSMs", §6) and state-spaces/mamba's Triton kernels
(``_chunk_cumsum_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``, ``_chunk_scan_fwd``).

Per token t and head h (``h_t`` is a (P, N) matrix)::

    Δ_t   = clamp(softplus?(dt_t + dt_bias[h]), lo, hi)        # softplus is the identity above 20
    h_t   = exp(Δ_t·A[h]) · h_{t-1} + Δ_t · (x_t ⊗ B_t)
    y_t   = h_t · C_t + D ⊙ x_t ;   out_t = y_t · silu(z_t)     # D, z optional

Head h reads group ``h // (H // G)`` of B and C. Units: Δ is a step size (dimensionless time); A is
a (negative) rate, so Δ·A is a log-decay.

Gradients: run :func:`ssd_reference` (or :func:`ssd_chunked_reference`) on fp64 leaves with
``requires_grad=True`` and use ``torch.autograd``; :func:`ssd_reference_grads` does exactly that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._common import (FP64, SequenceLayout, as_float, check_shape, expand_groups, round_to,
                      sequence_layout)
from .recurrence import scan_sequences

SOFTPLUS_THRESHOLD = 20.0
DEFAULT_DT_LIMIT = (0.0, math.inf)


def process_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=DEFAULT_DT_LIMIT, *, compute_dtype=FP64):
    """Δ from raw dt (BRIEF §2): ``clamp(softplus?(dt + dt_bias), lo, hi)``.

    dt: (..., H) any float dtype; dt_bias: (H) or None; dt_softplus: bool (softplus is the identity
    where its input is above 20, as in state-spaces/mamba; its derivative is sigmoid);
    dt_limit: (lo, hi), default (0, inf) (``torch.clamp``: zero gradient where it clamps).
    Returns Δ, same shape as dt, in ``compute_dtype`` (fp64 unless emulating a kernel's fp32 math).
    """
    delta = as_float(dt, compute_dtype)
    if dt_bias is not None:
        delta = delta + as_float(dt_bias, compute_dtype)
    if dt_softplus:
        delta = F.softplus(delta, beta=1.0, threshold=SOFTPLUS_THRESHOLD)
    lo, hi = dt_limit
    return torch.clamp(delta, min=lo, max=hi)


def chunk_cumsum_reference(dt, A, *, chunk_size, dt_bias=None, dt_softplus=False,
                           dt_limit=DEFAULT_DT_LIMIT, compute_dtype=FP64):
    """Processed Δ and its within-chunk cumulative log-decay, in ``_chunk_cumsum_fwd``'s layout.

    dt: (B, L, H); A: (H) fp32. Returns ``(dt_out, dA_cumsum)``, each (B, H, nchunks, chunk_size) in
    ``compute_dtype``, nchunks = ceil(L / chunk_size)::

        dt_out[b, h, c, s]    = Δ[b, c*Q + s, h]                      (0 past L)
        dA_cumsum[b, h, c, t] = sum_{s <= t} Δ[b, c*Q + s, h] · A[h]   (flat past L)
    """
    delta = process_dt(dt, dt_bias, dt_softplus, dt_limit, compute_dtype=compute_dtype)
    batch, seqlen, nheads = delta.shape
    nchunks = math.ceil(seqlen / chunk_size)
    delta = F.pad(delta, (0, 0, 0, nchunks * chunk_size - seqlen))
    dt_out = delta.reshape(batch, nchunks, chunk_size, nheads).permute(0, 3, 1, 2)
    dA_cumsum = torch.cumsum(dt_out * as_float(A, compute_dtype)[:, None, None], dim=-1)
    return dt_out, dA_cumsum


@dataclass(frozen=True)
class SSMStep:
    """One token of the BRIEF §2 recurrence for all heads of one row (a ``recurrence.Step``).

    State: (H, P, N). Row: x (H, P), dt (H) raw, B (G, N); for the output also C (G, N) and
    optionally z (H, P). Parameters are already in the compute dtype.
    """

    A: torch.Tensor                      # (H,)
    dt_bias: torch.Tensor | None         # (H,)
    dt_softplus: bool
    dt_limit: tuple
    D: torch.Tensor | None               # (H,) or (H, P)
    window_keys = ("x", "B", "dt")
    out_key = "x"

    def advance(self, state, row):
        delta = process_dt(row["dt"], self.dt_bias, self.dt_softplus, self.dt_limit,
                           compute_dtype=state.dtype)
        B = expand_groups(row["B"], self.A.shape[0])
        decay = torch.exp(delta * self.A)
        return decay[:, None, None] * state + (delta[:, None] * row["x"])[:, :, None] * B[:, None, :]

    def output(self, state_before, state_after, row):
        C = expand_groups(row["C"], self.A.shape[0])
        y = torch.einsum("hpn,hn->hp", state_after, C)
        if self.D is not None:
            y = y + (self.D if self.D.dim() == 2 else self.D[:, None]) * row["x"]
        if "z" in row:
            y = y * F.silu(row["z"])
        return y


def ssm_inputs(x, dt, A, B, C, D, z, dt_bias, compute_dtype=FP64):
    """x, dt, A, B, C, D, z, dt_bias as ``compute_dtype`` tensors (None stays None), with consistent shapes:
    x (batch, L, H, P), dt (batch, L, H), A (H), B and C (batch, L, G, N) with G dividing H, z like x,
    dt_bias (H), D (H) or (H, P). Raises ValueError naming the first inconsistent argument."""
    x, dt, A, B, C, D, z, dt_bias = (as_float(t, compute_dtype) for t in (x, dt, A, B, C, D, z, dt_bias))
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    check_shape("dt", dt, (batch, seqlen, nheads))
    check_shape("A", A, (nheads,))
    check_shape("B", B, (batch, seqlen, ngroups, dstate))
    check_shape("C", C, (batch, seqlen, ngroups, dstate))
    check_shape("z", z, x.shape)
    check_shape("dt_bias", dt_bias, (nheads,))
    if D is not None and tuple(D.shape) not in ((nheads,), (nheads, headdim)):
        raise ValueError(f"D has shape {tuple(D.shape)}, expected ({nheads},) or ({nheads}, {headdim})")
    if nheads % ngroups:
        raise ValueError(f"nheads={nheads} is not a multiple of ngroups={ngroups}")
    return x, dt, A, B, C, D, z, dt_bias


@dataclass(frozen=True)
class SSDProblem:
    """Validated SSD inputs in the compute dtype (see :func:`ssd_reference` for shapes)."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    dt_softplus: bool
    dt_limit: tuple
    initial_states: torch.Tensor          # (num_seqs, H, P, N), zeros when none were given
    layout: SequenceLayout

    @classmethod
    def build(cls, x, dt, A, B, C, *, D, z, dt_bias, dt_softplus, dt_limit, initial_states,
              seq_idx, cu_seqlens, compute_dtype=FP64):
        x, dt, A, B, C, D, z, dt_bias = ssm_inputs(x, dt, A, B, C, D, z, dt_bias, compute_dtype)
        initial_states = as_float(initial_states, compute_dtype)
        batch, seqlen, nheads, headdim = x.shape
        dstate = B.shape[3]
        layout = sequence_layout(batch, seqlen, seq_idx, cu_seqlens)
        state_shape = (layout.num_seqs, nheads, headdim, dstate)
        if initial_states is None:
            initial_states = x.new_zeros(state_shape)
        check_shape("initial_states", initial_states, state_shape)
        return cls(x, dt, A, B, C, D, z, dt_bias, dt_softplus, tuple(dt_limit), initial_states, layout)

    def step(self) -> SSMStep:
        return SSMStep(self.A, self.dt_bias, self.dt_softplus, self.dt_limit, self.D)

    def rows(self) -> dict[str, torch.Tensor]:
        rows = {"x": self.x, "dt": self.dt, "B": self.B, "C": self.C}
        if self.z is not None:
            rows["z"] = self.z
        return rows


def chunk_state_positions(layout: SequenceLayout, chunk_size: int):
    """Where ``chunk_states`` are taken: the state after the last token of every chunk.

    Returns ``(positions, seq, tokens)``: positions[c] = min(c*Q + Q - 1, L - 1) (same for every row);
    seq (B, nchunks) int64, the sequence that token belongs to; tokens (B, nchunks) int64, how many
    tokens of that sequence the state has consumed (position - sequence start + 1; the sequence's
    initial state, if any, is included on top). So ``chunk_states[b, c]`` is the state of sequence
    ``seq[b, c]`` after its first ``tokens[b, c]`` tokens -- what a prefix cache stores.
    """
    nchunks = math.ceil(layout.seqlen / chunk_size)
    positions = [min(c * chunk_size + chunk_size - 1, layout.seqlen - 1) for c in range(nchunks)]
    token_seq, token_start = layout.token_seq()
    pos = torch.tensor(positions, dtype=torch.int64)
    return positions, token_seq[:, pos], pos[None, :] - token_start[:, pos] + 1


def _results(problem, out, finals, chunk_states, chunk_size, return_final_states, return_chunk_states):
    result = {"out": out}
    if return_final_states:
        result["final_states"] = finals
    if return_chunk_states:
        _, seq, tokens = chunk_state_positions(problem.layout, chunk_size)
        result.update(chunk_states=chunk_states, chunk_state_seq=seq, chunk_state_tokens=tokens)
    return result


def ssd_reference(x, dt, A, B, C, *, chunk_size=None, D=None, z=None, dt_bias=None, dt_softplus=False,
                  dt_limit=DEFAULT_DT_LIMIT, initial_states=None, seq_idx=None, cu_seqlens=None,
                  return_final_states=False, return_chunk_states=False):
    """Token-by-token fp64 SSD forward (the oracle). BRIEF §2.

    Shapes: x (B, L, H, P); dt (B, L, H) raw; A (H) fp32; B, C (B, L, G, N); D (H) or (H, P);
    z (B, L, H, P); dt_bias (H); initial_states (num_seqs, H, P, N) (num_seqs == B unless packed);
    seq_idx (B, L) int32 or cu_seqlens (num_seqs + 1) int32 with B == 1 (packing convention:
    ``reference._common.SequenceLayout``). Inputs of any dtype, taken as-is then upcast to fp64.

    Returns a dict of fp64 tensors:
      out (B, L, H, P);
      final_states (num_seqs, H, P, N) if return_final_states: each sequence's state after its last token;
      if return_chunk_states (needs chunk_size): chunk_states (B, nchunks, H, P, N), the state after
      position min(c*Q + Q - 1, L - 1) of row b, with chunk_state_seq / chunk_state_tokens (B, nchunks)
      saying which sequence it belongs to and after how many of its tokens (:func:`chunk_state_positions`).
    A sequence start resets the state to that sequence's initial state (zero if none given).
    """
    if return_chunk_states and chunk_size is None:
        raise ValueError("return_chunk_states needs chunk_size")
    p = SSDProblem.build(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                         dt_limit=dt_limit, initial_states=initial_states, seq_idx=seq_idx,
                         cu_seqlens=cu_seqlens)
    keep = []
    if return_chunk_states:
        positions = chunk_state_positions(p.layout, chunk_size)[0]
        keep = [(b, pos) for b in range(p.layout.batch) for pos in positions]
    out, finals, kept = scan_sequences(p.step(), p.layout, p.rows(), p.initial_states, keep)
    chunk_states = None
    if return_chunk_states:
        chunk_states = torch.stack([torch.stack([kept[(b, pos)] for pos in positions])
                                    for b in range(p.layout.batch)])
    return _results(p, out, finals, chunk_states, chunk_size, return_final_states, return_chunk_states)


def ssd_chunked_reference(x, dt, A, B, C, *, chunk_size=None, D=None, z=None, dt_bias=None,
                          dt_softplus=False, dt_limit=DEFAULT_DT_LIMIT, initial_states=None, seq_idx=None,
                          cu_seqlens=None, return_final_states=False, return_chunk_states=False,
                          compute_dtype=FP64, operand_dtype=None):
    """The same SSD computed the chunked matrix way (SSD paper §6; the kernels' algorithm).

    Arguments and returns as :func:`ssd_reference` (chunk_size is required). Per chunk of Q tokens,
    with cs = the within-chunk cumsum of Δ·A (:func:`chunk_cumsum_reference`):

    - intra-chunk: ``y_t += sum_{s<=t, same chunk, same sequence} (C_t·B_s) exp(cs_t - cs_s) Δ_s x_s``;
    - inter-chunk: the state entering token t's run in this chunk -- the previous chunk's end state if
      t's sequence began before the chunk, else the sequence's initial state -- decayed by
      ``exp(cs_t - cs_before)`` where cs_before is the cumsum just before the run's first token here:
      ``y_t += exp(cs_t - cs_before) · (E_t · C_t)``;
    - state passing: the chunk-end state (and each sequence's final state) is the same sum with C
      dropped, taken chunk by chunk.

    Every exponent is a difference of cumsums that is mathematically <= 0 (A <= 0, Δ >= 0); it is
    clamped at 0 so rounding can never make exp overflow, and masked entries are selected out (never
    0·inf). Sequence boundaries inside chunks are masked by sequence number.

    ``compute_dtype`` / ``operand_dtype`` exist to *emulate a kernel's precision* (fp32 math; matmul
    operands rounded to the I/O dtype as tensor-core kernels do, cf. upstream's ``cb.to(x.dtype)``,
    ``b.to(x.dtype)``, ``prev_states.to(C.dtype)``); the oracle uses the defaults (fp64, no rounding).
    """
    if chunk_size is None:
        raise ValueError("ssd_chunked_reference needs chunk_size")
    p = SSDProblem.build(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                         dt_limit=dt_limit, initial_states=initial_states, seq_idx=seq_idx,
                         cu_seqlens=cu_seqlens, compute_dtype=compute_dtype)
    mma = lambda t: round_to(t, operand_dtype)  # noqa: E731  (a tensor-core operand)
    Q = chunk_size
    batch, seqlen, nheads, headdim = p.x.shape
    nchunks = math.ceil(seqlen / Q)
    pad = nchunks * Q - seqlen

    dt_out, dA_cumsum = chunk_cumsum_reference(p.dt, p.A, chunk_size=Q, dt_bias=p.dt_bias,
                                               dt_softplus=p.dt_softplus, dt_limit=p.dt_limit,
                                               compute_dtype=compute_dtype)
    delta = dt_out.permute(0, 2, 3, 1).reshape(batch, nchunks * Q, nheads)     # (B, Lp, H)
    cs = dA_cumsum.permute(0, 2, 3, 1).reshape(batch, nchunks * Q, nheads)     # (B, Lp, H)
    xs = F.pad(p.x, (0, 0, 0, 0, 0, pad))                                       # (B, Lp, H, P)
    Bs = F.pad(expand_groups(p.B, nheads), (0, 0, 0, 0, 0, pad))                # (B, Lp, H, N)
    Cs = F.pad(expand_groups(p.C, nheads), (0, 0, 0, 0, 0, pad))
    # Positions past L (Δ = 0, x = B = C = 0) continue the row's last sequence.
    seq, seq_start = (torch.cat([t, t[:, -1:].expand(-1, pad)], dim=1) for t in p.layout.token_seq())

    pos = torch.arange(nchunks * Q)
    chunk_start = (pos // Q) * Q
    from_prev = seq_start < chunk_start                      # (B, Lp): enters from the previous chunk
    run_start = torch.maximum(seq_start, chunk_start)        # first token of t's run in its chunk
    cs_before = torch.where((run_start > chunk_start)[..., None],
                            cs.gather(1, (run_start - 1).clamp(min=0)[..., None].expand_as(cs)),
                            cs.new_zeros(()))
    decay_in = torch.exp(torch.clamp(cs - cs_before, max=0.0))                 # (B, Lp, H)

    # Intra-chunk: (C_t·B_s) exp(cs_t - cs_s) Δ_s on the causal, same-sequence mask.
    chunked = lambda t: t.reshape(batch, nchunks, Q, *t.shape[2:])  # noqa: E731
    cs_c, seq_c = chunked(cs), chunked(seq)
    mask = (seq_c[:, :, :, None] == seq_c[:, :, None, :]) & torch.ones(Q, Q, dtype=torch.bool).tril()
    segsum = cs_c[:, :, :, None, :] - cs_c[:, :, None, :, :]                    # (B, nc, t, s, H)
    decay = torch.where(mask[..., None], torch.exp(torch.clamp(segsum, max=0.0)), segsum.new_zeros(()))
    CB = torch.einsum("bcthn,bcshn->bctsh", chunked(Cs), chunked(Bs))
    M = mma(CB * decay * chunked(delta)[:, :, None, :, :])
    y = torch.einsum("bctsh,bcshp->bcthp", M, mma(chunked(xs))).reshape(batch, nchunks * Q, nheads, headdim)

    def state_at(b, t, entering):
        """State after token t of row b, given the state entering t's run in its chunk."""
        s = torch.arange(int(run_start[b, t]), t + 1)
        weight = torch.exp(torch.clamp(cs[b, t] - cs[b, s], max=0.0)) * delta[b, s]          # (n, H)
        local = torch.einsum("shp,shn->hpn", mma(xs[b, s]), mma(weight[..., None] * Bs[b, s]))
        return decay_in[b, t][:, None, None] * entering + local

    out_rows, chunk_states, finals = [], [], {}
    for b in range(batch):
        ends = []                                            # state after each chunk's last token

        def entering(t):
            return ends[t // Q - 1] if from_prev[b, t] else p.initial_states[seq[b, t]]

        for c in range(nchunks):
            last = min(c * Q + Q - 1, seqlen - 1)
            ends.append(state_at(b, last, entering(last)))
        # Inter-chunk output: group the tokens by the state they enter from.
        inter = torch.zeros_like(y[b])
        source = torch.where(from_prev[b], pos // Q - 1, nchunks + seq[b])   # index into ends + inits
        for k in source.unique().tolist():
            E = ends[k] if k < nchunks else p.initial_states[k - nchunks]
            sel = source == k
            inter[sel] = torch.einsum("thn,hpn->thp", mma(Cs[b, sel]), mma(E)) * decay_in[b, sel][..., None]
        out_rows.append(y[b] + inter)
        chunk_states.append(torch.stack(ends))
        for sg in (s for s in p.layout.segments if s.row == b):
            finals[sg.seq] = (state_at(b, sg.end - 1, entering(sg.end - 1)) if sg.end > sg.start
                              else p.initial_states[sg.seq])

    out = torch.stack(out_rows)[:, :seqlen]
    if p.D is not None:
        out = out + (p.D if p.D.dim() == 2 else p.D[:, None]) * p.x
    if p.z is not None:
        out = out * F.silu(p.z)
    final_states = torch.stack([finals[i] for i in range(p.layout.num_seqs)])
    return _results(p, out, final_states, torch.stack(chunk_states), chunk_size,
                    return_final_states, return_chunk_states)


GRAD_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def ssd_reference_grads(dout, x, dt, A, B, C, *, dfinal_states=None, chunked=False, **options):
    """fp64 gradients of the SSD forward by torch.autograd through the reference.

    dout (B, L, H, P): gradient of ``out``; dfinal_states (num_seqs, H, P, N) or None: gradient of
    ``final_states``. ``options``: the keyword arguments of :func:`ssd_reference` (D, z, dt_bias,
    initial_states, seq_idx, cu_seqlens, ...). ``chunked=True`` differentiates
    :func:`ssd_chunked_reference` instead (faster at large L; needs chunk_size).

    Returns {"dx", "ddt", "dA", "dB", "dC", and "dD", "dz", "ddt_bias", "dinitial_states" for the
    optional inputs that were given}, fp64, each shaped like its input.
    """
    given = dict(x=x, dt=dt, A=A, B=B, C=C, **{k: options.pop(k) for k in GRAD_NAMES[5:] if k in options})
    leaves = {k: as_float(v).detach().requires_grad_(True) for k, v in given.items() if v is not None}
    fn = ssd_chunked_reference if chunked else ssd_reference
    args = {k: leaves.get(k) for k in given}
    result = fn(args.pop("x"), args.pop("dt"), args.pop("A"), args.pop("B"), args.pop("C"), **args,
                **options, return_final_states=dfinal_states is not None)
    outputs, grads_out = [result["out"]], [as_float(dout)]
    if dfinal_states is not None:
        outputs.append(result["final_states"])
        grads_out.append(as_float(dfinal_states))
    grads = torch.autograd.grad(outputs, list(leaves.values()), grads_out, allow_unused=True)
    return {"d" + k: (g if g is not None else torch.zeros_like(leaves[k]))
            for k, g in zip(leaves, grads)}
