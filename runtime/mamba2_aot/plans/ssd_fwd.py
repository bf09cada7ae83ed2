"""Launch plan of ``ssd_fwd``: the Mamba-2 chunked SSD forward (BRIEF §2 "ssd_fwd").

Call::

    launch("ssd_fwd", x=x, dt=dt, A=A, B=B, C=C, out=out, chunk_size=256, D=None, z=None, dt_bias=None,
           dt_softplus=False, dt_limit=(0.0, inf), initial_states=None, initial_state_indices=None,
           final_states=None, final_state_indices=None, chunk_states=None, seq_idx=None, cu_seqlens=None,
           workspace=None, stream=None)

=====================  ==============================  ============  ===========================================
argument               shape                           dtype         notes
=====================  ==============================  ============  ===========================================
x                      (batch, L, H, P)                bf16 / fp16   ``io`` dtype; last dim contiguous
dt                     (batch, L, H)                   io dtype      raw dt (before dt_bias and softplus)
A                      (H,)                            fp32          A <= 0 (the exponents are clamped at 0)
B, C                   (batch, L, G, N)                io dtype      G divides H; last dim contiguous
out                    (batch, L, H, P)                io dtype      written
D                      (H,) or (H, P), or None         fp32
z                      (batch, L, H, P) or None        io dtype      out = y · silu(z); last dim contiguous
dt_bias                (H,) or None                    fp32
initial_states         (num_seqs, H, P, N), or a pool  state dtype   read: each sequence starts from its row
                       (num_slots, H, P, N) with                     (or slot); zero if None
                       initial_state_indices
initial_state_indices  (num_seqs,) or None             int32         slot per sequence; < 0 or >= num_slots:
                                                                     start from zero
final_states           as initial_states               state dtype   written: each sequence's state after its
final_state_indices    (num_seqs,) or None             int32         last token (slot < 0 or out of range:
                                                                     not written)
chunk_states           (batch, nchunks, H, P, N)       fp32          written: the state after position
                                                                     min(c·Q + Q - 1, L - 1) of each row;
                                                                     8-byte aligned, even strides
seq_idx                (batch, L) or None              int32         packed sequences: a new sequence where the
                                                                     value changes along L (non-decreasing)
cu_seqlens             (num_seqs + 1,) or None         int32         packed sequences along L, batch == 1
workspace              (n,) or None                    fp32          scratch for a split call (below); 16-byte
                                                                     aligned, contiguous
=====================  ==============================  ============  ===========================================

``nchunks = ceil(L / chunk_size)``; chunk_size is 64, 128 or 256 and only places ``chunk_states`` (the kernel computes
in 64-token blocks whatever the chunk size). The state dtype (the variant's) is the dtype of the state arrays: fp32, or
bf16 / fp16 for state pools; initial and final states share it. The tensor-core products take their operands in the I/O
dtype (accumulating in fp32): C·Bᵀ scaled by Δ and the decays, the Δ-weighted x and the state entering each 64-token
block (never the carried fp32 state) are rounded to it, as in the Triton kernels (the weighted x's weight
Δ_s·2^(cs_end-cs_s) is rounded to it too, before the product). With fp16 I/O such an operand beyond 65504 (e.g.
abs(C_t·B_s)·Δ_s, or a weight with Δ past 65504: NaN where x is 0) becomes inf; bf16 has fp32's range. Each (sequence or
slot, head) state block is a contiguous P × N matrix. x, z, B and C are read and out written with 16-byte vectors: their
data pointers must be 16-byte aligned and their batch, L and head/group strides multiples of 8 elements (true of dense
tensors and of column slices of a fused projection whose widths are multiples of 8).

Sequences (what ``num_seqs`` counts): without packing, row b is sequence b. With ``cu_seqlens`` (batch 1),
sequence i is tokens cu_seqlens[i]:cu_seqlens[i+1] (non-decreasing; entries are clamped to [0, L], so a bad
one never reads out of bounds). With ``seq_idx`` (non-decreasing along L), a row is split wherever seq_idx
changes; per-sequence states then need batch 1 (sequences numbered 0, 1, ... along L, num_seqs being the state
arrays' first dim; sequences past it get a zero initial state and no final state). A sequence start resets the state
to that sequence's initial state. Reading and writing one pool (initial_states is final_states) is allowed:
a sequence reads its slot before writing; slots written must be distinct and not read by another sequence
of the call (as for verify). With cu_seqlens, tokens outside every sequence are not computed: their out rows
and a chunk state whose last token is one of them are not written. A non-finite input value in one sequence
can reach another sequence that shares its 64-token block (the block's products add every row, weighted by
zero outside the sequence), and so can one in rows outside every sequence: those of x and B must be finite
(conv1d_fwd writes them as zeros); padding past L is zero-filled and never contributes.

One CTA per (64 rows of P, head, row or sequence) walks its tokens in order: grid rule
``headdim/64,heads,sequences``. When that gives too few CTAs to fill the GPU (at most half of :data:`CTA_SLOTS`, a
quarter for d_state 256), a call is split along L into ``segments`` (:func:`plan_segments`), in two launches: a
states-only pass (the state recurrence alone: no C·Bᵀ, no outputs) walks the first segments and leaves the state
entering each later segment, then every segment runs at once from its entering state. The entering states go to
``chunk_states`` when the call asks for them (segments then start on chunk boundaries), else to the workspace.
When it gives more CTAs than the GPU runs at once and the last wave would run part-empty (:func:`plan_handover`: the
2.7B shape's 640 CTAs in 264 slots), a call without chunk_states is split into segments in one launch instead: each
segment waits for the one before it to hand its end state over (through the workspace: the state entering every
segment after the first in fp32, and flags that the runtime zeroes before the launch), so the waves are shorter and
the last one fuller. The workspace: ``workspace_size("ssd_fwd", x=x, B=B, ...)`` bytes (batch · (segments - 1) · H
· P · N fp32, and for a handover its flags; 0 when the call is not split, or split in one ssd_fwd_inline launch: pass
its seq_idx, cu_seqlens, chunk_states and state arrays too for an exact answer, else it is the most a call with these
x and B can use).
With a smaller workspace a states-only split takes as many segments as it holds, and a handover is not made (a
workspace sized for one call serves every call). A call (without chunk_states) that the states-only split would split
and whose segments pair runs them instead in one launch of ``ssd_fwd_inline`` when it has no workspace room for an
entering state, or when the states-only pass would walk at most INLINE_PASS_MAX tokens (:func:`_inline_plan`):
segment s > 0 walks the state recurrence alone from its row's start up to its own start (the states-only pass's
operations), then its outputs; the first segments are the longer (:func:`plan_inline`). Then it needs no workspace.
A workspace is checked like an input (device, overlaps) whether or not the call uses it; calls on several streams
need one each (a handover's flags shared by two streams' calls would be zeroed under a waiting segment: it would
wait forever). The results are bitwise those of the unsplit call (the same operations in the same order). Calls with
``seq_idx`` or ``cu_seqlens``, and calls that read and write one state pool in place, are not split.

Which kernel runs a launch (:func:`launch_family`): a states-only pass ``ssd_fwd_pass`` (``kernel_src/ssd_fwd_pass.py``:
the pass with its tiles loaded three blocks ahead); a split with an inline pass ``ssd_fwd_inline``
(``kernel_src/ssd_fwd_inline.py``); else two heads per CTA (``kernel_src/ssd_fwd_paired.py``: on sm_90a one CTA per
SM walks two heads with warp-specialized warpgroups; on sm_100a its cubin is the walk) when the launch has d_state <=
128, no ``seq_idx``, an even number of heads per group and its walk's CTAs (two per pair of heads) would not fit one
per SM (:func:`paired_pays`), on ``ssd_fwd_paired`` with z at N 128 and else on ``ssd_fwd_inline`` again (its prefix
empty); else ``ssd_fwd``'s walk. ssd_fwd_inline runs a launch without z at N 128 on its variant without z slots
(:func:`with_family_constants`). All four compute the same values in the same order: the
outputs are the same bits whichever runs for finite inputs (without D the walk adds 0 · x, the paired kernel nothing:
an infinite x gives NaN in the walk's out only).
"""
from __future__ import annotations

import math

from ..errors import AlignmentError, InvalidArgumentError, ShapeError, StrideError
from ..validation import (GRID_YZ_MAX, BoundCall, expect_bool, expect_complete, expect_contiguous_last_dim,
                          expect_dim, expect_dt_limit, expect_dtype, expect_given, expect_int, expect_rank,
                          expect_shape, null_absent, expect_state_blocks, record_strides, stride_names, vector_misfit)
from ..tensors import DeviceArray, as_device_array
from .base import CompositePlan, StepPlan
from .sequence_states import bind_cu_seqlens, bind_sequence_states, state_dtype
from .ssm_inputs import SSM_STRIDES, bind_ssm_inputs, expect_groups, expect_ssm_operand, x_shape

IO_DTYPES = ("bf16", "fp16")
STATE_DTYPES = ("fp32", "bf16", "fp16")
CHUNK_SIZES = (64, 128, 256)
P_TILE = 64   # head-dim rows per CTA (the grid rule's "headdim/64")
VECTOR = 8    # elements per 16-byte vector copy of x, B, C
STATE_ARRAYS = ("initial_states", "initial_state_indices", "final_states", "final_state_indices")
BLOCK = 64    # tokens per block of the kernel's walk: segments start on block boundaries
# CTAs the GPU runs at once: two per SM (one for d_state 256) on an H100 / H200 (132 SMs). A constant, not the
# device's: on a GPU with fewer SMs a split call may take two waves, on one with more it splits too little (and
# the sm_100a cubins run one CTA per SM at every d_state, so there a split may take two waves).
CTA_SLOTS = 2 * 132
MIN_SEGMENT = 256  # tokens: shorter segments do not pay for the second launch
# The split's cost model, in full-block units (measured on the H200, docs/PERF_NOTES.md, sixth session): a block of
# the states-only pass costs 0.42 of a full one, a full block of a CTA sharing its SM with another 1.28. (Full
# blocks got ~1.27x faster since, the states-only pass less: not re-measured.)
STATES_PASS_COST = 0.42
SHARED_SM_COST = 1.28
# ssd_fwd_paired against the walk (measured on the H200, unsplit calls of 16-255 CTAs of two heads, docs/PERF_NOTES.md,
# twenty-eighth session): once the walk's CTAs (two per pair) no longer fit one per SM, the paired kernel is faster at
# every count measured (72-255 pairs: 1.03-1.31x; a wave of paired CTAs takes 0.80 of a walk wave of two CTAs per SM);
# at one walk CTA per SM or fewer the two are even (0.96-1.02x), and the walk stays.
SMS = CTA_SLOTS // 2  # the SMs of an H100 / H200
PAIRED_FAMILY = "ssd_fwd_paired"
PASS_FAMILY = "ssd_fwd_pass"
INLINE_FAMILY = "ssd_fwd_inline"
MAX_HANDOVER_SEGMENTS = 4  # each hand-over costs a wait and a pipeline refill: a few, not many
# An inline pass's block (ssd_fwd_inline walking the state alone before a segment's outputs) against a block with
# outputs: its time share, by (d_state, whether the outputs are gated by z) (measured on the H200, docs/PERF_NOTES.md,
# thirtieth session; N 128 re-fitted on an H100, forty-fifth session: with z, blocks with outputs got cheaper once z was
# published with Y_FREE; without z, they are cheaper still and the variant without z slots has rings of three)
INLINE_PASS_COST = {(64, True): 0.6, (64, False): 0.6, (128, True): 0.5, (128, False): 0.6}
# With a workspace, a split whose states-only pass walks more tokens than this runs in two launches (ssd_fwd_pass, then
# the segments): a long pass amortises its launch and its ring's fill, and its blocks cost less than an inline pass's
# (measured on the H200: B2 L2048, a pass of 1024 tokens, 7-9 % faster inline; L8192, 4096 tokens, 3 % slower)
INLINE_PASS_MAX = 2048
# A handover must beat the unsplit walk's waves by this much: the unsplit call's part-empty last wave runs faster
# than a full one (its CTAs share fewer SMs), so counting it as whole overstates the unsplit cost.
HANDOVER_GAIN = 0.9


def _cta_slots(d_state: int) -> int:
    return CTA_SLOTS if d_state <= 128 else CTA_SLOTS // 2


def _ctas(batch: int, nheads: int, headdim: int) -> int:
    """CTAs of an unsplit call without packed sequences: one per (64 rows of P, head, row)."""
    return batch * nheads * (headdim // P_TILE)


def plan_segments(batch: int, seqlen: int, nheads: int, headdim: int, d_state: int, align: int = BLOCK,
                  most: int | None = None) -> tuple[int, int]:
    """(segments, segment_len) of a call: how many segments of L its rows are split into, and their length in
    tokens (a multiple of ``align``; the last segment may be shorter). Candidates: up to as many segments as the
    free CTA slots take (at most ``most``, each of at least MIN_SEGMENT tokens); the one the cost model says is
    fastest, or one segment (no split) when none beats the unsplit walk."""
    ctas = _ctas(batch, nheads, headdim)
    slots = _cta_slots(d_state)
    wanted = min(slots // max(ctas, 1), seqlen // MIN_SEGMENT, -(-seqlen // align))
    if most is not None:
        wanted = min(wanted, most)
    best_cost, best = float(seqlen), (1, seqlen)
    for candidate in range(2, wanted + 1):
        segment_len = -(-seqlen // (candidate * align)) * align
        segments = -(-seqlen // segment_len)
        cost = STATES_PASS_COST * (segments - 1) * segment_len + SHARED_SM_COST * segment_len
        if cost < best_cost:
            best_cost, best = cost, (segments, segment_len)
    return best


def plan_inline(pairs: int, seqlen: int, d_state: int, gated: bool) -> tuple[int, int]:
    """(segments, segment_len) of a split call (with z: ``gated``) run as one ssd_fwd_inline launch of ``pairs`` CTAs
    (two heads each) per segment: segment s > 0 walks the state alone over the s · segment_len tokens before it (each
    such block at INLINE_PASS_COST[d_state, gated] of a block with outputs), the last segment runs to L, so the first
    segments are longer than the last. Candidates: the segment counts whose CTAs fit one per SM and pair
    (:func:`paired_pays`); their segment_len equalises the first segments' time, (1 + c·(segments - 2)) · segment_len,
    with the last's, c · (segments - 1) · segment_len + L - (segments - 1) · segment_len (c = INLINE_PASS_COST[d_state,
    gated]). (1, seqlen) when none leaves every segment at least MIN_SEGMENT tokens."""
    c = INLINE_PASS_COST[d_state, gated]
    best_cost, best = float(seqlen), (1, seqlen)
    for candidate in range(2, SMS // max(pairs, 1) + 1):
        if not paired_pays(pairs * candidate):
            continue
        segment_len = math.ceil(seqlen / (BLOCK * (candidate - c))) * BLOCK
        if seqlen - (candidate - 1) * segment_len < MIN_SEGMENT:
            continue
        cost = max((1 + c * (candidate - 2)) * segment_len,
                   c * (candidate - 1) * segment_len + seqlen - (candidate - 1) * segment_len)
        if cost < best_cost:
            best_cost, best = cost, (candidate, segment_len)
    return best


def plan_handover(batch: int, seqlen: int, nheads: int, headdim: int, d_state: int) -> tuple[int, int]:
    """(segments, segment_len) of a call whose CTAs fill the GPU more than once, run as one launch whose segments
    hand their states over; (1, seqlen) when that does not pay. Its last wave runs part-empty (the 2.7B shape's 640
    CTAs take three waves of 264), and k segments per row make the waves k times shorter: the walk takes
    ceil(k · CTAs / slots) / k row times instead of ceil(CTAs / slots)."""
    ctas = _ctas(batch, nheads, headdim)
    slots = _cta_slots(d_state)
    best_cost, best = HANDOVER_GAIN * -(-ctas // slots), (1, seqlen)
    if ctas <= slots:  # one wave: a segment would only wait for the one before it
        return best
    for candidate in range(2, MAX_HANDOVER_SEGMENTS + 1):
        segment_len = -(-seqlen // (candidate * BLOCK)) * BLOCK
        if segment_len < MIN_SEGMENT:
            break
        segments = -(-seqlen // segment_len)
        cost = -(-segments * ctas // slots) * segment_len / seqlen
        if cost < best_cost:
            best_cost, best = cost, (segments, segment_len)
    return best


# the parameters of the forward's walk, which ssd_bwd's recompute (ssd_fwd_states) shares
FORWARD_WALK_PARAMS = (
    ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out",
     "initial_states", "initial_state_indices", "final_states", "final_state_indices",
     "chunk_states", "seq_idx", "cu_seqlens",
     "batch", "seqlen", "nheads", "heads_per_group", "num_seqs",
     "num_initial_slots", "num_final_slots", "chunk_size", "nchunks", "segments", "segment_len", "states_only")
    + SSM_STRIDES
    + stride_names("initial_states", "slot", "head") + stride_names("initial_state_indices", "seq")
    + stride_names("final_states", "slot", "head") + stride_names("final_state_indices", "seq")
    + stride_names("chunk_states", "batch", "chunk", "head") + stride_names("seq_idx", "batch", "seqlen")
    + stride_names("cu_seqlens", "seq")
    + ("has_D", "has_z", "has_dt_bias", "dt_softplus",
       "has_initial_states", "has_initial_state_indices", "has_final_states", "has_final_state_indices",
       "has_chunk_states", "has_seq_idx", "has_cu_seqlens",
       "dt_min", "dt_max")
)


def ssd_shape(x: DeviceArray, B: DeviceArray) -> tuple[int, int, int, int]:
    """x (batch, seqlen, H, P) and B (batch, seqlen, G, N) as ssd_fwd and ssd_bwd take them: bf16 / fp16, seqlen >= 1,
    P a positive multiple of 64, N >= 1, B in x's dtype, G dividing H. Returns x's shape. Raises DTypeError or
    ShapeError (what ``workspace_size`` checks of a call, as its launch would)."""
    batch, seqlen, nheads, headdim = x_shape(x, IO_DTYPES, "seqlen")
    if seqlen < 1:
        raise ShapeError("x", f"x: seqlen (dim 1) must be >= 1, got shape {x.shape}")
    if headdim < P_TILE or headdim % P_TILE:
        raise ShapeError("x", f"x: headdim (dim 3) = {headdim} must be a positive multiple of {P_TILE}")
    expect_ssm_operand(B, x, expect_groups(B, nheads), "seqlen")
    if B.shape[3] < 1:
        raise ShapeError("B", f"B: d_state (dim 3) must be >= 1, got shape {B.shape}")
    return x.shape


class SsdForwardPlan(CompositePlan):
    family = "ssd_fwd"
    step_families = ("ssd_fwd", PASS_FAMILY, PAIRED_FAMILY, INLINE_FAMILY)
    grid_rule = "headdim/64,heads,sequences"
    param_names = FORWARD_WALK_PARAMS + ("segment_flags", "has_segment_flags")
    arrays = ("x", "dt", "A", "B", "C", "out", "D", "z", "dt_bias", "chunk_states", "seq_idx",
              "cu_seqlens", "workspace") + STATE_ARRAYS

    def workspace_size(self, *, x=None, B=None, seq_idx=None, cu_seqlens=None, chunk_states=None,
                       initial_states=None, final_states=None, **_) -> int:
        """Bytes of workspace for a call with these x (batch, L, H, P) and B (batch, L, G, N) (CUDA arrays of any
        framework, as the launch takes them): what its split needs; 0 for calls that are not split or keep the
        entering states in chunk_states (packed sequences, chunk_states, one pool read and written in place), when
        those arguments are given too."""
        expect_given(x=x, B=B)
        in_place = initial_states is not None and final_states is not None and (  # (as split_call: the same memory)
            as_device_array(initial_states, "initial_states").ptr == as_device_array(final_states, "final_states").ptr)
        if seq_idx is not None or cu_seqlens is not None or chunk_states is not None or in_place:
            return 0
        x, B = as_device_array(x, "x"), as_device_array(B, "B")
        batch, seqlen, nheads, headdim = ssd_shape(x, B)
        if batch * nheads == 0:
            return 0
        segments, _ = plan_handover(batch, seqlen, nheads, headdim, B.shape[3])
        if segments > 1:
            return sum(_handover_bytes(batch, segments, nheads, headdim, B.shape[3]))
        # (split in one launch, ssd_fwd_inline, with z or without: z is not among the arguments here)
        if all(_inline_plan(batch, seqlen, nheads, headdim, B.shape[3], nheads // B.shape[2], gated, room=True)[0] > 1
               for gated in (False, True)):
            return 0
        segments, _ = plan_segments(batch, seqlen, nheads, headdim, B.shape[3])
        return (segments - 1) * _entering_state_bytes(batch, nheads, headdim, B.shape[3])

    def steps(self, *, workspace=None, **kwargs) -> list[tuple[str, BoundCall]]:
        """Validate a call (see the module docstring) and bind its launches: the call itself, a split call's
        states-only pass and its segments, or its segments handing their states over. Raises the
        InvalidArgumentError subclasses."""
        call = self.bind(**kwargs)
        if workspace is not None:
            expect_workspace(workspace, "ssd_fwd")
        return [with_family_constants(launch_family(step), step) for step in split_call(call, workspace)]

    def bind(self, *, x, dt, A, B, C, out, chunk_size=256, D=None, z=None, dt_bias=None, dt_softplus=False,
             dt_limit=(0.0, math.inf), initial_states=None, initial_state_indices=None, final_states=None,
             final_state_indices=None, chunk_states=None, seq_idx=None, cu_seqlens=None) -> BoundCall:
        """Validate a call (see the module docstring) and bind it as one launch, not split. Raises the
        InvalidArgumentError subclasses."""
        chunk_size = expect_int("chunk_size", chunk_size, minimum=1)
        if chunk_size not in CHUNK_SIZES:
            raise InvalidArgumentError("chunk_size", f"chunk_size: expected one of {CHUNK_SIZES}, got {chunk_size}")
        dt_softplus = expect_bool("dt_softplus", dt_softplus)
        dt_min, dt_max = expect_dt_limit(dt_limit)
        expect_given(x=x, dt=dt, A=A, B=B, C=C, out=out)

        batch, seqlen, nheads, headdim = ssd_shape(x, B)
        expect_dim("x", "seqlen (dim 1)", seqlen)
        expect_dim("x", "nheads (dim 2)", nheads, maximum=GRID_YZ_MAX)
        params = {"chunk_size": chunk_size, "dt_softplus": int(dt_softplus), "dt_min": dt_min, "dt_max": dt_max}
        (*_, d_state), inputs = bind_ssm_inputs(params, x=x, dt=dt, A=A, B=B, C=C, out=out, D=D, z=z,
                                                dt_bias=dt_bias, length="seqlen")
        for arr in (x, z, B, C, out):
            if arr is not None:
                expect_vector_operand(arr)
        params.update(batch=batch, seqlen=seqlen, nheads=nheads, nchunks=-(-seqlen // chunk_size), segments=1,
                      segment_len=seqlen, states_only=0, segment_flags=0, has_segment_flags=0,
                      inline_pass=0)  # (not a kernel parameter: the launches with an inline pass go to ssd_fwd_inline)
        outputs = [out]

        # sequences: where they come from, how many there are, and how many CTAs walk them (grid z)
        if seq_idx is not None and cu_seqlens is not None:
            raise InvalidArgumentError("seq_idx", "seq_idx: pass seq_idx or cu_seqlens, not both")
        num_seqs, sources = batch, batch
        if cu_seqlens is not None:
            num_seqs = sources = bind_cu_seqlens(params, cu_seqlens, batch, "x")
            inputs.append(cu_seqlens)
        if seq_idx is not None:
            expect_dtype(seq_idx, ("int32",))
            expect_shape(seq_idx, (batch, seqlen), "(batch, seqlen) of x")
            record_strides(params, seq_idx, ("batch", "seqlen"))
            inputs.append(seq_idx)
            given = [a for a in (initial_states, final_states) if a is not None]
            if given and batch != 1:
                raise ShapeError("x", "x: per-sequence states with seq_idx need batch == 1 (sequences are "
                                 f"numbered along one row), got batch {batch}; use cu_seqlens or one row")
            counts = [idx.shape[0] if idx is not None and len(idx.shape) == 1 else arr.shape[0]
                      for arr, idx in ((initial_states, initial_state_indices), (final_states, final_state_indices))
                      if arr is not None]
            num_seqs = counts[0] if counts else batch
        expect_dim("cu_seqlens" if cu_seqlens is not None else "x", "batch rows or sequences (grid z)", sources,
                   maximum=GRID_YZ_MAX)
        params["num_seqs"] = num_seqs

        dtype = state_dtype(initial_states, final_states, STATE_DTYPES, default="fp32")

        read, written = bind_sequence_states(
            params, initial_states=initial_states, initial_state_indices=initial_state_indices,
            final_states=final_states, final_state_indices=final_state_indices, num_seqs=num_seqs,
            block=(nheads, headdim, d_state), block_dims="nheads, headdim, d_state", stride_dims=("slot", "head"),
            check_block=lambda arr: expect_state_blocks(arr, d_state, "(sequence, head)"))
        inputs += read
        outputs += written

        if chunk_states is not None:
            expect_dtype(chunk_states, ("fp32",))
            expect_shape(chunk_states, (batch, params["nchunks"], nheads, headdim, d_state),
                         "(batch, ceil(seqlen / chunk_size), nheads, headdim, d_state)")
            expect_state_blocks(chunk_states, d_state, "(row, chunk, head)")
            expect_state_pairs(chunk_states)
            record_strides(params, chunk_states, ("batch", "chunk", "head"))
            outputs.append(chunk_states)

        optional = {"chunk_states": chunk_states, "seq_idx": seq_idx, "cu_seqlens": cu_seqlens}
        for name, arr in optional.items():
            params[name] = arr.ptr if arr is not None else 0
            params[f"has_{name}"] = int(arr is not None)
        null_absent(params, self.param_names, (*optional, *STATE_ARRAYS))  # absent: null pointer and zero strides
        expect_complete(params, self.param_names, self.family)

        return BoundCall(
            constants={"headdim": headdim, "d_state": d_state, "io_dtype": x.dtype, "state_dtype": dtype},
            grid=(headdim // P_TILE, nheads, sources),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )


def _entering_state_bytes(batch: int, nheads: int, headdim: int, d_state: int) -> int:
    """Workspace bytes per segment after the first: the fp32 state entering it, per (row, head)."""
    return batch * nheads * headdim * d_state * 4


def _handover_bytes(batch: int, segments: int, nheads: int, headdim: int, d_state: int) -> tuple[int, int]:
    """Workspace bytes of a call whose segments hand their states over: (the fp32 state entering each segment after
    the first, a 32-bit flag per CTA of the segments before the last, rounded up to 16 bytes)."""
    flags = (segments - 1) * _ctas(batch, nheads, headdim)
    return (segments - 1) * _entering_state_bytes(batch, nheads, headdim, d_state), -(-flags * 4 // 16) * 16


def _entering_states(call: BoundCall, workspace: DeviceArray, segments: int, segment_len: int) -> tuple:
    """The workspace's first (batch, segments - 1, H, P, N) fp32, the states entering the segments after the first,
    as the kernel's chunk states of segment-long chunks: (that region, the kernel parameters that name it)."""
    p, constants = call.params, call.constants
    entering = workspace.region("workspace", 0, (p["batch"], segments - 1, p["nheads"], constants["headdim"],
                                                 constants["d_state"]), "fp32")
    return entering, {"chunk_states": entering.ptr, "chunk_size": segment_len, "nchunks": segments - 1,
                      **dict(zip(stride_names("chunk_states", "batch", "chunk", "head"), entering.strides))}


def block_states_call(call: BoundCall, states: DeviceArray) -> tuple[str, BoundCall]:
    """``call`` (bound without chunk_states) as ``ssd_fwd_states``: the states-only walk writing the state after
    every 64-token block (after the last token of the block's sequence that reaches its end, or of the row) to
    ``states``, (batch, ceil(seqlen / 64), nheads, headdim, d_state) in the I/O dtype with 16-byte aligned rows,
    and nothing else: ssd_bwd's recompute. Packed sequences too (the walk splits blocks at sequence starts)."""
    p = call.params
    assert not p["has_chunk_states"], "block states replace chunk states"
    headdim, d_state = call.constants["headdim"], call.constants["d_state"]
    expect_dtype(states, (call.constants["io_dtype"],))
    expect_shape(states, (p["batch"], -(-p["seqlen"] // BLOCK), p["nheads"], headdim, d_state),
                 "(batch, ceil(seqlen / 64), nheads, headdim, d_state)")
    expect_state_blocks(states, d_state, "(row, block, head)")
    expect_vector_operand(states)
    walk = {name: p[name] for name in FORWARD_WALK_PARAMS}  # (not the handover's: this walk is never split)
    params = _states_only(walk, has_chunk_states=0, block_states=states.ptr, has_block_states=1)
    record_strides(params, states, ("batch", "block", "head"))
    return "ssd_fwd_states", call._replace(params=params, outputs=(states,))


def _states_only(params: dict, **changes) -> dict:
    """A call's kernel parameters (with ``changes``) for the states-only walk: no outputs but its states (chunk states
    unless ``changes`` say otherwise)."""
    return dict(params, **{"has_chunk_states": 1, **changes}, states_only=1, has_final_states=0,
                has_final_state_indices=0)


def split_call(call: BoundCall, workspace: DeviceArray | None) -> list[BoundCall]:
    """``call`` (bound by :meth:`SsdForwardPlan.bind`) as its launches: itself, or split along L (module
    docstring) into segments, which hand their states over in one launch (a call over a wave of CTAs, with room for
    it in ``workspace``) or follow a states-only pass. The entering states go to the call's chunk_states, or to
    ``workspace`` (the segments it holds). A workspace the call does not use is still among its arrays, so that it
    is checked (device, overlaps) whether or not the call is split."""
    p = call.params
    unsplit = [call if workspace is None else call._replace(inputs=call.inputs + (workspace,))]
    in_place = p["has_initial_states"] and p["initial_states"] == p["final_states"]
    if p["has_seq_idx"] or p["has_cu_seqlens"] or in_place or 0 in call.grid:
        return unsplit
    batch, seqlen, nheads = p["batch"], p["seqlen"], p["nheads"]
    headdim, d_state = call.constants["headdim"], call.constants["d_state"]
    own_chunks = bool(p["has_chunk_states"])
    if not own_chunks and workspace is not None:
        handover = _handover_call(call, workspace)
        if handover is not None:
            return [handover]
    if own_chunks:
        align, most = p["chunk_size"], None
    else:
        capacity = 0 if workspace is None else workspace.shape[0] * 4
        align, most = BLOCK, 1 + capacity // _entering_state_bytes(batch, nheads, headdim, d_state)
    if not own_chunks:  # the segments in one launch with an inline pass, where they pair and that pays
        room = most > 1
        inline_segments, inline_len = _inline_plan(batch, seqlen, nheads, headdim, d_state, p["heads_per_group"],
                                                   bool(p["has_z"]), room)
        if inline_segments > 1:
            # (the kernel ends its last segment at segment_len, not at L: the segments must cover the row)
            assert inline_segments * inline_len >= seqlen, (inline_segments, inline_len, seqlen)
            # (nchunks 0: no chunk state to enter from, so ssd_fwd_inline walks each segment from its row's start)
            inline = dict(p, segments=inline_segments, segment_len=inline_len, inline_pass=1, nchunks=0)
            return [unsplit[0]._replace(grid=_segments_grid(call.grid, inline_segments), params=inline)]
    segments, segment_len = plan_segments(batch, seqlen, nheads, headdim, d_state, align, most)
    if segments < 2:
        return unsplit
    if own_chunks:  # already the kernel's chunk_states, with the call's chunk size
        entering, entering_params, also_read = next(a for a in call.outputs if a.name == "chunk_states"), {}, ()
    else:
        entering, entering_params = _entering_states(call, workspace, segments, segment_len)
        also_read = (entering,)
    # the states-only pass: the first segments as one shorter call, its chunk states the entering states
    walked = (segments - 1) * segment_len
    states_pass = _states_only(p, **entering_params, seqlen=walked, segment_len=walked)
    # (every input of the call: the entering states it writes must overlap none of them)
    first = BoundCall(call.constants, call.grid, states_pass, inputs=call.inputs, outputs=(entering,))
    segmented = dict(p, **entering_params, segments=segments, segment_len=segment_len)
    second = BoundCall(call.constants, _segments_grid(call.grid, segments), segmented,
                       inputs=call.inputs + also_read, outputs=call.outputs)
    return [first, second]


def _inline_plan(batch: int, seqlen: int, nheads: int, headdim: int, d_state: int, heads_per_group: int,
                 gated: bool, room: bool) -> tuple[int, int]:
    """(segments, segment_len) of a call (no packed sequences, no chunk_states) that the states-only split would
    split, run instead as one ssd_fwd_inline launch (:func:`plan_inline`): when its segments pair, and either its
    workspace has no ``room`` for an entering state or the states-only pass would walk at most INLINE_PASS_MAX
    tokens; else (1, seqlen)."""
    segments, segment_len = plan_segments(batch, seqlen, nheads, headdim, d_state)
    if not _pairable(d_state, heads_per_group) or segments < 2:
        return 1, seqlen
    if room and (segments - 1) * segment_len > INLINE_PASS_MAX:
        return 1, seqlen
    return plan_inline(_ctas(batch, nheads, headdim) // 2, seqlen, d_state, gated)


def _pairable(d_state: int, heads_per_group: int) -> bool:
    """ssd_fwd_paired's kernel can run a launch (without seq_idx) of this d_state and heads per group: an even number
    of heads per group makes H even, and a CTA's two heads share B and C."""
    return d_state <= 128 and heads_per_group % 2 == 0


def paired_pays(pairs: int) -> bool:
    """Whether ssd_fwd_paired's ``pairs`` CTAs (two heads each) beat the walk's 2 · ``pairs``: when those do not fit
    one per SM (above)."""
    return 2 * pairs > SMS


def with_family_constants(family: str, launch: BoundCall) -> tuple[str, BoundCall]:
    """(family, launch) with the constants of the family's variant: ssd_fwd_inline's ``z_gate``, False for a launch
    without z at N 128 (that variant has no z slots, and its B, C and x have rings of three instead of two), else
    True."""
    if family != INLINE_FAMILY:
        return family, launch
    z_gate = bool(launch.params["has_z"]) or launch.constants["d_state"] != 128
    return family, launch._replace(constants={**launch.constants, "z_gate": z_gate})


def launch_family(launch: BoundCall) -> str:
    """The family whose kernel runs ``launch`` (one launch of an ssd_fwd call): ssd_fwd_pass for a states-only pass,
    ssd_fwd_inline for a split with an inline pass; two heads per CTA when that CTA can run the launch and
    :func:`paired_pays` for its CTAs (module docstring): ssd_fwd_paired with z at N 128, else ssd_fwd_inline's cubins
    (their prefix empty: 1-8 % faster there, by their loaders' order and, without z at N 128, their variant without z
    slots; 1.4-2.4 % slower with z at N 128: docs/PERF_NOTES.md, forty-sixth session); else ssd_fwd."""
    p = launch.params
    if p["states_only"]:
        return PASS_FAMILY
    if p["inline_pass"]:
        return INLINE_FAMILY
    ptiles, heads, sources = launch.grid
    d_state = launch.constants["d_state"]
    runnable = not p["has_seq_idx"] and _pairable(d_state, p["heads_per_group"])
    if not (runnable and paired_pays(ptiles * (heads // 2) * sources)):
        return "ssd_fwd"
    return PAIRED_FAMILY if d_state == 128 and p["has_z"] else INLINE_FAMILY


class SsdForwardPairedPlan(StepPlan):
    """ssd_fwd's launches that ``kernel_src/ssd_fwd_paired.py`` runs (:func:`launch_family`)."""
    family = PAIRED_FAMILY
    step_of = "ssd_fwd"
    grid_rule = SsdForwardPlan.grid_rule
    param_names = SsdForwardPlan.param_names


class SsdForwardInlinePlan(StepPlan):
    """A split ssd_fwd call in one launch, which ``kernel_src/ssd_fwd_inline.py`` runs (:func:`launch_family`)."""
    family = INLINE_FAMILY
    step_of = "ssd_fwd"
    grid_rule = SsdForwardPlan.grid_rule
    param_names = SsdForwardPlan.param_names


class SsdForwardPassPlan(StepPlan):
    """A split ssd_fwd call's states-only pass, which ``kernel_src/ssd_fwd_pass.py`` runs (:func:`launch_family`)."""
    family = PASS_FAMILY
    step_of = "ssd_fwd"
    grid_rule = SsdForwardPlan.grid_rule
    param_names = FORWARD_WALK_PARAMS


def _handover_call(call: BoundCall, workspace: DeviceArray) -> BoundCall | None:
    """``call`` as one launch of segments that hand their states over (kernel_src/ssd_fwd.py), their end states and
    flags in ``workspace``; None when that does not pay (:func:`plan_handover`) or the workspace is too small."""
    p = call.params
    batch, seqlen, nheads = p["batch"], p["seqlen"], p["nheads"]
    headdim, d_state = call.constants["headdim"], call.constants["d_state"]
    segments, segment_len = plan_handover(batch, seqlen, nheads, headdim, d_state)
    if segments < 2:
        return None
    states_bytes, flags_bytes = _handover_bytes(batch, segments, nheads, headdim, d_state)
    if workspace.shape[0] * 4 < states_bytes + flags_bytes:
        return None
    # each segment's end state (but the last's) is the chunk state the next segment enters from
    states, entering_params = _entering_states(call, workspace, segments, segment_len)
    flags = workspace.region("workspace", states_bytes, (flags_bytes // 4,), "int32")
    params = dict(p, **entering_params, has_chunk_states=1, segments=segments, segment_len=segment_len,
                  segment_flags=flags.ptr, has_segment_flags=1)
    return BoundCall(call.constants, _segments_grid(call.grid, segments), params, inputs=call.inputs,
                     outputs=call.outputs + (states, flags), zeroed=(flags,))


def _segments_grid(grid: tuple[int, int, int], segments: int) -> tuple[int, int, int]:
    """The grid of a call's segments: (P / 64 · rows, heads, segments), so that the GPU, which starts CTAs in the
    order of their linear block index, starts every row's first segment before any second one (a handover's segment
    then waits only for a CTA that started before it)."""
    ptiles, heads, rows = grid
    return ptiles * rows, heads, segments


def expect_workspace(workspace: DeviceArray, family: str, needed: int = 0) -> None:
    """A workspace: 1-D fp32, contiguous, 16-byte aligned, writable, and at least ``needed`` bytes."""
    if workspace.readonly:
        raise InvalidArgumentError("workspace", "workspace: is read-only but the kernels write it")
    expect_dtype(workspace, ("fp32",))
    expect_rank(workspace, 1, "(n,)")
    if workspace.shape[0] * 4 < needed or (workspace.shape[0] > 1 and workspace.strides[0] != 1):
        raise ShapeError("workspace", f"workspace: needs {-(-needed // 4)} contiguous fp32 elements "
                         f"(workspace_size({family!r}, ...) = {needed} bytes), got shape {workspace.shape} "
                         f"strides {workspace.strides}")
    if workspace.ptr % 16:
        raise AlignmentError("workspace", f"workspace: data pointer {workspace.ptr:#x} must be 16-byte aligned")


def expect_state_pairs(arr) -> None:
    """chunk_states are written an accumulator pair (two fp32, 8 bytes) at a time: an 8-byte aligned base and
    even strides except the last."""
    misfit = vector_misfit(arr, width=8)
    if misfit == "pointer":
        raise AlignmentError(arr.name, f"{arr.name}: data pointer {arr.ptr:#x} must be 8-byte aligned")
    if misfit == "strides":
        raise StrideError(arr.name, f"{arr.name}: strides {arr.strides} must be even except the last (fp32 "
                          "pairs are written 8 bytes at a time)")


def expect_vector_operand(arr) -> None:
    """x, z, B, C (and out) move 16 bytes at a time: a contiguous last dim, 16-byte aligned base, strides multiples
    of 8 elements."""
    expect_contiguous_last_dim(arr)
    misfit = vector_misfit(arr)
    if misfit == "pointer":
        raise AlignmentError(arr.name, f"{arr.name}: data pointer {arr.ptr:#x} must be 16-byte aligned")
    if misfit == "strides":
        raise StrideError(arr.name, f"{arr.name}: strides {arr.strides} must be multiples of {VECTOR} elements "
                          "(16 bytes) except the last")

