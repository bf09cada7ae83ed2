"""Launch plan of ``ssd_bwd``: the Mamba-2 chunked SSD backward (BRIEF §2 "ssd_bwd"), four steps in order.

Call::

    launch("ssd_bwd", x=x, dt=dt, A=A, B=B, C=C, dout=dout, dx=dx, ddt=ddt, dA=dA, dB=dB, dC=dC,
           workspace=workspace, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, inf),
           initial_states=None, initial_state_indices=None, dfinal_states=None, seq_idx=None, cu_seqlens=None,
           dD=None, dz=None, ddt_bias=None, dinitial_states=None, stream=None)

The forward's arguments (x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states,
initial_state_indices, seq_idx, cu_seqlens) are exactly ``ssd_fwd``'s (see plans/ssd_fwd.py), and so are its
rules, but that nheads must be at least 1 (an empty ``ssd_fwd`` call is a no-op; with no heads, dB and dC would be
zero, and no launch writes only those). A batch of 0 launches step 4 alone, which writes dA, dD and ddt_bias as sums
over no tokens: zero. The gradients:

=================  ==========================  ======  =============================================================
argument           shape                       dtype   notes
=================  ==========================  ======  =============================================================
dout               (batch, L, H, P)            io      gradient of ``out``, read; last dim contiguous, 16-byte rows
dfinal_states      (num_seqs, H, P, N) / None  fp32    gradient of each sequence's final state, read (zero if None)
dx, dz             like x / z                  io      written (dz: required with z, refused without); 16-byte rows
ddt                like dt                     io      written: d loss / d raw dt (through dt_bias, softplus, limit)
dA                 (H,)                        fp32    written
dB, dC             like B / C                  io      written (summed over the heads of a group)
dD                 like D                      fp32    written (required with D, refused without)
ddt_bias           (H,)                        fp32    written (required with dt_bias, refused without)
dinitial_states    (num_seqs, H, P, N) / None  fp32    written: gradient of each sequence's initial state (also
                                                       without initial_states: the gradient at a zero state)
workspace          (n,) with n >= size / 4     fp32    scratch; ``workspace_size("ssd_bwd", x=x, B=B)`` bytes
=================  ==========================  ======  =============================================================

State blocks (num_seqs, H, P, N) are contiguous P × N matrices per (sequence, head). num_seqs is batch, the sequences
of cu_seqlens, or with seq_idx (batch 1) the first dim of the state arrays given (rows of dinitial_states for
sequences a seq_idx row does not contain are not written). dx, ddt and dz are zero on rows outside every cu_seqlens
sequence; dout, x, B and C must be finite there. Nothing is accumulated into: every gradient is overwritten. No
gradient, and not the workspace, may overlap an input or another output (checked across the steps). There are
no gradients for ``ssd_fwd``'s ``chunk_states`` or final-state pools.

Steps (launches on one stream, in order; everything validated before the first; steps 1 and 2 are one launch of
``ssd_bwd_walks`` when both together fit one wave and N <= 128, see :func:`walks_side_by_side`):

1. ``ssd_fwd_states``, the forward's states-only walk, recomputes the state after every 64-token block
   (``workspace.states``, in the I/O dtype) in one pass with no outputs (packed sequences too: it splits a block at
   its sequence starts);
2. ``ssd_bwd_dstates`` walks each sequence backwards: the state gradient after every block (``workspace.dstates``)
   and ``dinitial_states``;
3. ``ssd_bwd_chunk``, one CTA per (64-token block, group, row, head split): dx, ddt, dz (from y, which it
   recomputes from its own S, the entering states and D), dB, dC and per-block partial sums
   (``workspace.partials``). A group's heads are split over several CTAs (``head_splits``, see
   :func:`head_splits`) when (block, group, row) alone would leave most of the GPU idle; each split then writes its
   share of dB and dC (``workspace.group_grads``) instead of dB and dC. At N 256 a group's columns of N are split
   over two CTAs (:func:`d_state_splits`), each writing its fp32 share of dx, dz and ddt
   (``workspace.dx_shares`` / ``dz_shares`` / ``ddt_shares``) instead of dx, dz and ddt;
4. ``ssd_bwd_reduce``, one CTA per head: dA, dD, ddt_bias; with head splits, more CTAs add the shares of dB and dC;
   at N 256, more add the shares of dx, dz and ddt.

Workspace (each region 256-byte aligned): states and dstates (batch · ceil(L/64) · H · P · N each, in the I/O dtype:
the chunk pass's products take h₀ and dh_end in that dtype, so rounding them on the way halves their bytes and
changes only ⟨dh_end, h₀⟩, which then has both rounded; Triton's backward keeps its states and state gradients in the
I/O dtype too), partials (batch · ceil(L/64) · H · (P + 2), fp32) and, with head splits, group_grads (2 ·
head_splits · batch · L · G · N, fp32; the region is kept at the most any call with at most this batch and length
needs, so that a workspace sized for one call serves every smaller one) and, at N 256, the shares of dx and dz (2 ·
batch · L · H · P each; dz's whether or not z is given, as the size depends on x and B alone) and of ddt (2 · batch
· L · H), fp32; partials then has rows (row, part of N) too. Deterministic: no atomics, every sum in a
fixed order, so repeated calls give bitwise-identical gradients.
"""
from __future__ import annotations

import functools
import math

from ..errors import InvalidArgumentError, ShapeError
from ..tensors import DeviceArray, ITEMSIZE, as_device_array
from ..validation import (GRID_YZ_MAX, BoundCall, check_call, expect_complete, expect_dim, expect_dtype,
                          expect_given, expect_shape, expect_state_blocks, null_absent, record_strides,
                          stride_names)
from .base import CompositePlan, StepPlan
from .ssd_fwd import (BLOCK, CTA_SLOTS, FORWARD_WALK_PARAMS, SsdForwardPlan, block_states_call,
                      expect_vector_operand, expect_workspace, ssd_shape)
from .ssm_inputs import SSM_INPUT_STRIDES

ALIGN = 256        # bytes: alignment of each workspace region
PARTIAL_EXTRA = 2  # partials[..., P] = dA, [..., P + 1] = ddt_bias
# ssd_bwd_chunk CTAs to aim for: about one wave of one CTA per SM on an H100 / H200 (132 SMs); B200 has 148
TARGET_CTAS = 128
GROUP_SUM_ELEMENTS = 1024  # dB / dC elements per group-sum CTA of ssd_bwd_reduce (kernel_src/ssd_bwd_reduce.py)
SHARE_SUM_ELEMENTS = 8192  # dx / dz elements per share-sum CTA of ssd_bwd_reduce (in 8-column vectors)
STATE_COLUMNS = 128        # the most columns of N an ssd_bwd_chunk CTA holds (kernel_src/ssd_bwd_chunk.py)
WALKS_D_STATES = (64, 128)  # ssd_bwd_walks' (at N 256 each walk's CTA takes an SM alone: nothing to share)


def d_state_splits(d_state: int) -> int:
    """Over how many ssd_bwd_chunk CTAs a group's columns of N are split (N 256: two, each leaving its shares of dx,
    dz and ddt for ssd_bwd_reduce to add)."""
    return -(-d_state // STATE_COLUMNS)


def head_splits(batch: int, nblocks: int, ngroups: int, heads_per_group: int, d_state: int) -> int:
    """Over how many ssd_bwd_chunk CTAs each group's heads are split: the smallest divisor of heads_per_group that
    gives at least 7/8 of TARGET_CTAS CTAs (all of them if none does). Each split costs 2 · batch · L · G · N fp32
    of workspace and their sum, so there is none when (block, group, row, part of N) CTAs alone come that close."""
    return _splits(batch * nblocks * ngroups * d_state_splits(d_state), heads_per_group, TARGET_CTAS)


def _splits(ctas: int, heads_per_group: int, target: int) -> int:
    for splits in range(1, heads_per_group + 1):
        if heads_per_group % splits == 0 and 8 * ctas * splits >= 7 * target:
            return splits
    return heads_per_group


def group_grads_capacity(batch: int, nblocks: int, ngroups: int, heads_per_group: int, d_state: int) -> int:
    """fp32 elements the workspace keeps for the dB / dC shares: the most that any call with at most this batch
    and this many blocks needs. Splits shrink as calls grow, so a call's own need is not monotone in its size;
    this is, and a workspace sized for one call serves every smaller one."""
    return _capacity(batch, nblocks, ngroups, heads_per_group, d_state, TARGET_CTAS)


@functools.lru_cache(maxsize=256)
def _capacity(batch: int, nblocks: int, ngroups: int, heads_per_group: int, d_state: int, target: int) -> int:
    # a call's need depends only on its rows x blocks (k), and there are splits only while k · ngroups is small
    most = 0
    for k in range(1, batch * nblocks + 1):
        splits = _splits(k * ngroups * d_state_splits(d_state), heads_per_group, target)
        if splits == 1:
            break  # and so for every larger k
        if any(k % rows == 0 and k // rows <= nblocks for rows in range(1, min(batch, k) + 1)):
            most = max(most, 2 * splits * k * BLOCK * ngroups * d_state)
    return most


class _StepPlan(StepPlan):
    step_of = "ssd_bwd"


class SsdForwardStatesPlan(_StepPlan):
    """ssd_bwd's recompute of the forward's states (``kernel_src/ssd_fwd_states.py``, bound by
    ``plans.ssd_fwd.block_states_call``)."""
    family = "ssd_fwd_states"
    grid_rule = SsdForwardPlan.grid_rule
    # ssd_fwd's (its states_only is 1), then the block states this walk writes
    param_names = (FORWARD_WALK_PARAMS + ("block_states",)
                   + stride_names("block_states", "batch", "block", "head") + ("has_block_states",))


class SsdBackwardStatesPlan(_StepPlan):
    family = "ssd_bwd_dstates"
    grid_rule = "headdim/64,heads,sequences"
    param_names = (
        ("dout", "z", "dt", "A", "C", "dt_bias", "dfinal_states", "dinitial_states", "dstates", "seq_idx", "cu_seqlens",
         "batch", "seqlen", "nheads", "heads_per_group", "num_seqs", "nblocks")
        + stride_names("dout", "batch", "seqlen", "head") + stride_names("z", "batch", "seqlen", "head")
        + stride_names("dt", "batch", "seqlen", "head") + stride_names("A", "head")
        + stride_names("C", "batch", "seqlen", "group") + stride_names("dt_bias", "head")
        + stride_names("dfinal_states", "seq", "head") + stride_names("dinitial_states", "seq", "head")
        + stride_names("dstates", "batch", "block", "head") + stride_names("seq_idx", "batch", "seqlen")
        + stride_names("cu_seqlens", "seq")
        + ("has_z", "has_dt_bias", "dt_softplus", "has_dfinal_states", "has_dinitial_states", "has_seq_idx",
           "has_cu_seqlens", "dt_min", "dt_max")
    )


# kernel_src/ssd_bwd_walks.py: the reverse pass's parameters follow the recompute's with this prefix
REVERSE_PREFIX = "reverse_"


class SsdBackwardWalksPlan(_StepPlan):
    """ssd_bwd's recompute and reverse pass side by side in one launch (``kernel_src/ssd_bwd_walks.py``, bound by
    :func:`side_by_side`)."""
    family = "ssd_bwd_walks"
    grid_rule = "headdim/64,heads,2*sequences"
    param_names = (SsdForwardStatesPlan.param_names
                   + tuple(REVERSE_PREFIX + name for name in SsdBackwardStatesPlan.param_names))


def walks_side_by_side(walk_grid: tuple[int, int, int]) -> bool:
    """Whether the two walks, each of ``walk_grid``, run as one launch: when both fit in one wave of it (two CTAs
    per SM on sm_90a), so that each SM holds a CTA of each. Larger calls already fill the SMs with either walk alone;
    there each keeps its own launch (the reverse pass fits three CTAs per SM, the walks' kernel two). Off sm_90a the
    walks' CTA is 8 warps, one per SM: a call taken as one launch there runs as two waves, about as two launches would
    (unmeasured, as everything off sm_90a)."""
    return 2 * math.prod(walk_grid) <= CTA_SLOTS


def side_by_side(recompute: BoundCall, reverse: BoundCall) -> BoundCall:
    """The ``ssd_bwd_walks`` call running the bound ``ssd_fwd_states`` and ``ssd_bwd_dstates`` calls at once: their
    grids one after the other along z (they match in x and y), the reverse pass's parameters prefixed."""
    assert recompute.grid == reverse.grid, (recompute.grid, reverse.grid)
    tiles, heads, sources = recompute.grid
    params = dict(recompute.params)
    params.update((REVERSE_PREFIX + name, value) for name, value in reverse.params.items())
    return BoundCall(constants=recompute.constants, grid=(tiles, heads, 2 * sources), params=params,
                     inputs=recompute.inputs + reverse.inputs, outputs=recompute.outputs + reverse.outputs)


# ssd_bwd_reduce's: the shares of dx, dz and ddt with d_state_splits, and the gradients it writes from them
SHARED_GRADS = ("dx_shares", "dz_shares", "ddt_shares", "dx", "dz", "ddt")
GROUP_GRADS_DIMS = ("grad", "split", "batch", "seqlen", "group")
GROUP_GRADS_STRIDES = stride_names("group_grads", *GROUP_GRADS_DIMS)


class SsdBackwardChunkPlan(_StepPlan):
    family = "ssd_bwd_chunk"
    grid_rule = "seqlen/64,groups*head_splits,batch*d_state_splits"
    param_names = (
        ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dout", "dx", "ddt", "dB", "dC", "dz",
         "initial_states", "initial_state_indices", "states", "dfinal_states", "dstates", "partials", "group_grads",
         "seq_idx", "cu_seqlens",
         "batch", "seqlen", "nheads", "heads_per_group", "head_splits", "num_seqs", "num_initial_slots", "nblocks")
        + SSM_INPUT_STRIDES
        + stride_names("dout", "batch", "seqlen", "head") + stride_names("dx", "batch", "seqlen", "head")
        + stride_names("ddt", "batch", "seqlen", "head") + stride_names("dB", "batch", "seqlen", "group")
        + stride_names("dC", "batch", "seqlen", "group") + stride_names("dz", "batch", "seqlen", "head")
        + stride_names("initial_states", "slot", "head") + stride_names("initial_state_indices", "seq")
        + stride_names("states", "batch", "block", "head") + stride_names("dfinal_states", "seq", "head")
        + stride_names("dstates", "batch", "block", "head") + stride_names("partials", "batch", "block", "head")
        + GROUP_GRADS_STRIDES
        + stride_names("seq_idx", "batch", "seqlen") + stride_names("cu_seqlens", "seq")
        + ("has_D", "has_z", "has_dt_bias", "dt_softplus", "has_initial_states", "has_initial_state_indices",
           "has_dfinal_states", "has_seq_idx", "has_cu_seqlens", "dt_min", "dt_max")
    )


class SsdBackwardReducePlan(_StepPlan):
    family = "ssd_bwd_reduce"
    grid_rule = "heads+group_sum_ctas+share_sum_ctas"
    param_names = (
        ("partials", "dD", "dA", "ddt_bias", "group_grads", "dB", "dC", *SHARED_GRADS, "batch", "seqlen", "nblocks",
         "nheads", "ngroups", "d_state", "head_splits", "group_sum_ctas", "d_state_splits", "share_sum_ctas")
        + stride_names("partials", "batch", "block", "head") + stride_names("dD", "head", "dim")
        + stride_names("dA", "head") + stride_names("ddt_bias", "head") + GROUP_GRADS_STRIDES
        + stride_names("dB", "batch", "seqlen", "group") + stride_names("dC", "batch", "seqlen", "group")
        + tuple(s for name in SHARED_GRADS for s in stride_names(name, "batch", "seqlen", "head"))
        + ("has_dD", "dD_per_head", "has_ddt_bias", "has_z")
    )


class Workspace:
    """The regions of the caller's fp32 workspace, as device arrays named for the kernel parameters they feed."""

    def __init__(self, batch: int, seqlen: int, nheads: int, headdim: int, ngroups: int, d_state: int, io: str):
        nblocks = -(-seqlen // BLOCK)
        self.head_splits = head_splits(batch, nblocks, ngroups, nheads // ngroups, d_state)
        parts = d_state_splits(d_state)
        state_shape = (batch, nblocks, nheads, headdim, d_state)
        # (partials, and the shares of dx, dz and ddt with d_state_splits, in rows (row, part of N))
        self.layout = [("states", state_shape, io), ("dstates", state_shape, io),
                       ("partials", (batch * parts, nblocks, nheads, headdim + PARTIAL_EXTRA), "fp32")]
        if parts > 1:
            self.layout += [("dx_shares", (batch * parts, seqlen, nheads, headdim), "fp32"),
                            ("dz_shares", (batch * parts, seqlen, nheads, headdim), "fp32"),
                            ("ddt_shares", (batch * parts, seqlen, nheads), "fp32")]
        if self.head_splits > 1:
            self.layout.append(("group_grads", (2, self.head_splits, batch, seqlen, ngroups, d_state), "fp32"))
        self.offsets, offset = {}, 0
        for name, shape, dtype in self.layout:
            self.offsets[name] = offset
            offset += -(-math.prod(shape) * ITEMSIZE[dtype] // ALIGN) * ALIGN
        # group_grads' region is the last: kept at its capacity even when this call uses less (or none of it)
        reserved = group_grads_capacity(batch, nblocks, ngroups, nheads // ngroups, d_state) * ITEMSIZE["fp32"]
        group_grads = self.offsets.get("group_grads", offset)
        self.size = max(offset, -(-(group_grads + reserved) // ALIGN) * ALIGN)

    def views(self, ws: DeviceArray) -> dict[str, DeviceArray]:
        return {name: ws.region(name, self.offsets[name], shape, dtype) for name, shape, dtype in self.layout}


def _rename(arr: DeviceArray | None, name: str) -> DeviceArray | None:
    return None if arr is None else arr._replace(name=name)


class SsdBackwardPlan(CompositePlan):
    family = "ssd_bwd"
    step_families = ("ssd_fwd_states", "ssd_bwd_dstates", "ssd_bwd_walks", "ssd_bwd_chunk", "ssd_bwd_reduce")
    arrays = ("x", "dt", "A", "B", "C", "dout", "dx", "ddt", "dA", "dB", "dC", "workspace", "D", "z", "dt_bias",
              "initial_states", "initial_state_indices", "dfinal_states", "seq_idx", "cu_seqlens", "dD", "dz",
              "ddt_bias", "dinitial_states")

    def workspace_size(self, *, x=None, B=None, **_) -> int:
        """Bytes of workspace for a call with these x (batch, L, H, P) and B (batch, L, G, N) (CUDA arrays of any
        framework, as the launch takes them)."""
        expect_given(x=x, B=B)
        x, B = as_device_array(x, "x"), as_device_array(B, "B")
        return Workspace(*ssd_shape(x, B), *B.shape[2:], x.dtype).size

    def steps(self, *, x, dt, A, B, C, dout, dx, ddt, dA, dB, dC, workspace, D=None, z=None, dt_bias=None,
              dt_softplus=False, dt_limit=(0.0, math.inf), initial_states=None, initial_state_indices=None,
              dfinal_states=None, seq_idx=None, cu_seqlens=None, dD=None, dz=None, ddt_bias=None,
              dinitial_states=None) -> list[tuple[str, BoundCall]]:
        """Validate a call (see the module docstring) and bind its launches. Raises the
        InvalidArgumentError subclasses."""
        expect_given(x=x, dt=dt, A=A, B=B, C=C, dout=dout, dx=dx, ddt=ddt, dA=dA, dB=dB, dC=dC, workspace=workspace)
        batch, seqlen, nheads, headdim = ssd_shape(x, B)
        if nheads == 0:
            raise ShapeError("x", f"x: shape {x.shape}: ssd_bwd needs nheads >= 1 (with no heads, dB and dC would be "
                             "zero, and no launch writes only those)")
        ngroups = B.shape[2]
        d_state = B.shape[3]
        io = x.dtype
        parts = d_state_splits(d_state)
        # (ssd_bwd_chunk's grid z: the forward checks batch alone, and nothing may launch before this is refused)
        expect_dim("x", f"batch (dim 0) × {parts} parts of d_state (grid z)", batch * parts, maximum=GRID_YZ_MAX)
        ws = Workspace(batch, seqlen, nheads, headdim, ngroups, d_state, io)
        expect_workspace(workspace, "ssd_bwd", ws.size)
        views = ws.views(workspace)

        # 1. the forward's states, recomputed: its validation is the forward's own (dx stands in for its out, which
        # the states-only walk does not write: checked here first, so that an error names it)
        expect_dtype(dx, (io,))
        expect_shape(dx, x.shape, f"the shape of {x.name}")
        expect_vector_operand(dx)
        forward = SsdForwardPlan().bind(
            x=x, dt=dt, A=A, B=B, C=C, out=_rename(dx, "out"), chunk_size=BLOCK, D=D, dt_bias=dt_bias,
            dt_softplus=dt_softplus, dt_limit=dt_limit, initial_states=initial_states,
            initial_state_indices=initial_state_indices, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
        fp = forward.params
        nblocks = -(-seqlen // BLOCK)

        # the gradients' shapes follow their inputs' (z first: the forward's recompute does not read it)
        if z is not None:
            expect_dtype(z, (io,))
            expect_shape(z, x.shape, "(batch, seqlen, nheads, headdim) of x")
            expect_vector_operand(z)
        for name, grad, source in (("dz", dz, z), ("dD", dD, D), ("ddt_bias", ddt_bias, dt_bias)):
            if grad is not None and source is None:
                raise InvalidArgumentError(name, f"{name}: given without {name[1:]}")
            if grad is None and source is not None:
                raise InvalidArgumentError(name, f"{name}: required when {name[1:]} is given")
        for grad, like in ((dout, x), (dz, z), (ddt, dt), (dB, B), (dC, C)):
            if grad is not None:
                expect_dtype(grad, (io,))
                expect_shape(grad, like.shape, f"the shape of {like.name}")
        for moved_in_vectors in (dout, dz):
            if moved_in_vectors is not None:
                expect_vector_operand(moved_in_vectors)
        expect_dtype(dA, ("fp32",))
        expect_shape(dA, (nheads,), "(nheads,)")
        if dD is not None:
            expect_dtype(dD, ("fp32",))
            expect_shape(dD, D.shape, "the shape of D")
        if ddt_bias is not None:
            expect_dtype(ddt_bias, ("fp32",))
            expect_shape(ddt_bias, (nheads,), "(nheads,)")

        # sequences, and the per-sequence state gradients
        num_seqs = fp["num_seqs"]
        sources = num_seqs if cu_seqlens is not None else batch
        state_grads = [a for a in (dfinal_states, dinitial_states) if a is not None]
        if seq_idx is not None and state_grads:
            if batch != 1:
                raise ShapeError("x", f"x: per-sequence state gradients with seq_idx need batch == 1, got {batch}")
            if initial_states is None:
                num_seqs = state_grads[0].shape[0] if state_grads[0].shape else 0
        for arr in state_grads:
            expect_dtype(arr, ("fp32",))
            expect_shape(arr, (num_seqs, nheads, headdim, d_state), "(num_seqs, nheads, headdim, d_state)")
            expect_state_blocks(arr, d_state, "(sequence, head)")

        common = {"batch": batch, "seqlen": seqlen, "nheads": nheads, "heads_per_group": fp["heads_per_group"],
                  "num_seqs": num_seqs, "nblocks": nblocks, "dt_softplus": fp["dt_softplus"], "dt_min": fp["dt_min"],
                  "dt_max": fp["dt_max"]}
        packing = {name: fp[name] for name in ("seq_idx", "cu_seqlens", "has_seq_idx", "has_cu_seqlens")}
        packing.update((p, fp[p]) for p in stride_names("seq_idx", "batch", "seqlen") + stride_names("cu_seqlens", "seq"))
        packing_arrays = [a for a in (seq_idx, cu_seqlens) if a is not None]

        # 2. the state gradient, backwards
        dstates = views["dstates"]
        sp = {**common, **packing, "dout": dout.ptr, "dt": dt.ptr, "A": A.ptr, "C": C.ptr, "dstates": dstates.ptr}
        for arr, dims in ((dout, ("batch", "seqlen", "head")), (dt, ("batch", "seqlen", "head")), (A, ("head",)),
                          (C, ("batch", "seqlen", "group")), (dstates, ("batch", "block", "head"))):
            record_strides(sp, arr, dims)
        optional = {"z": (z, ("batch", "seqlen", "head")), "dt_bias": (dt_bias, ("head",)),
                    "dfinal_states": (dfinal_states, ("seq", "head")),
                    "dinitial_states": (dinitial_states, ("seq", "head"))}
        for name, (arr, dims) in optional.items():
            sp[name] = arr.ptr if arr is not None else 0
            sp[f"has_{name}"] = int(arr is not None)
            if arr is not None:
                record_strides(sp, arr, dims)
        null_absent(sp, SsdBackwardStatesPlan.param_names, optional)
        expect_complete(sp, SsdBackwardStatesPlan.param_names, "ssd_bwd_dstates")
        states_call = BoundCall(
            constants={"headdim": headdim, "d_state": d_state, "io_dtype": io},
            grid=(headdim // BLOCK, nheads, sources), params=sp,
            inputs=tuple([dout, dt, A, C] + [a for a in (z, dt_bias, dfinal_states) if a is not None]
                         + packing_arrays),
            outputs=tuple([dstates] + ([dinitial_states] if dinitial_states is not None else [])))

        # 3. the per-block gradients (with head splits: dB and dC as each split's share in group_grads; with
        # d_state_splits, dx, dz and ddt as each part's share)
        states, partials = views["states"], views["partials"]
        # with d_state_splits, the chunk pass writes each part's shares of dx, dz and ddt as its dx, dz and ddt, and
        # ssd_bwd_reduce adds them: (gradient, its shares)
        shared_grads = [(grad, views[f"{grad.name}_shares"]) for grad in (dx, dz, ddt)
                        if grad is not None and parts > 1]
        chunk_grads = {grad.name: _rename(share, grad.name) for grad, share in shared_grads}
        chunk_dx, chunk_dz, chunk_ddt = (chunk_grads.get(name, grad) for name, grad in (("dx", dx), ("dz", dz),
                                                                                         ("ddt", ddt)))
        group_grads = views.get("group_grads")
        splits = {"head_splits": ws.head_splits}
        if group_grads is not None:
            splits["group_grads"] = group_grads.ptr
            record_strides(splits, group_grads, GROUP_GRADS_DIMS)
        null_absent(splits, SsdBackwardChunkPlan.param_names, ("group_grads",))
        cp = {name: fp[name] for name in SsdBackwardChunkPlan.param_names if name in fp}
        cp.update(common, **packing, **splits, dout=dout.ptr, dx=chunk_dx.ptr, ddt=chunk_ddt.ptr, dB=dB.ptr, dC=dC.ptr,
                  states=states.ptr, dstates=dstates.ptr, partials=partials.ptr, has_z=int(z is not None),
                  has_dfinal_states=int(dfinal_states is not None))
        for arr, dims in ((dout, ("batch", "seqlen", "head")),
                          (chunk_dx, ("batch", "seqlen", "head")), (chunk_ddt, ("batch", "seqlen", "head")),
                          (dB, ("batch", "seqlen", "group")), (dC, ("batch", "seqlen", "group")),
                          (states, ("batch", "block", "head")), (dstates, ("batch", "block", "head")),
                          (partials, ("batch", "block", "head"))):
            record_strides(cp, arr, dims)
        for arr, name in ((z, "z"), (chunk_dz, "dz"), (dfinal_states, "dfinal_states")):
            if arr is not None:
                cp[name] = arr.ptr
                record_strides(cp, arr, ("seq", "head") if name == "dfinal_states" else ("batch", "seqlen", "head"))
        null_absent(cp, SsdBackwardChunkPlan.param_names, ("z", "dz", "dfinal_states"))
        expect_complete(cp, SsdBackwardChunkPlan.param_names, "ssd_bwd_chunk")
        # (grid y and z: the groups and rows, within the forward's checked heads and rows)
        chunk_call = BoundCall(
            constants={"headdim": headdim, "d_state": d_state, "io_dtype": io,
                       "state_dtype": forward.constants["state_dtype"]},
            grid=(nblocks, ngroups * ws.head_splits, batch * parts), params=cp,
            inputs=tuple(forward.inputs) + tuple(a for a in (z, dout, states, dstates, dfinal_states)
                                                 if a is not None),
            outputs=tuple(a for a in (chunk_dx, chunk_ddt, dB, dC, chunk_dz, partials, group_grads) if a is not None))

        # 4. the sums over tokens, over head splits and over parts of N
        group_sum_ctas = -(-batch * seqlen * ngroups * d_state // GROUP_SUM_ELEMENTS) if group_grads is not None else 0
        share_sum_ctas = -(-batch * seqlen * nheads * headdim // SHARE_SUM_ELEMENTS) if parts > 1 else 0
        rp = {"partials": partials.ptr, "dA": dA.ptr, "batch": batch, "seqlen": seqlen, "nblocks": nblocks,
              "nheads": nheads, "ngroups": ngroups, "d_state": d_state, "group_sum_ctas": group_sum_ctas,
              "d_state_splits": parts, "share_sum_ctas": share_sum_ctas, "has_z": int(z is not None),
              "dB": dB.ptr, "dC": dC.ptr, **splits,
              "dD": dD.ptr if dD is not None else 0, "has_dD": int(dD is not None),
              "dD_per_head": int(D is not None and len(D.shape) == 1),
              "ddt_bias": ddt_bias.ptr if ddt_bias is not None else 0, "has_ddt_bias": int(ddt_bias is not None)}
        record_strides(rp, partials, ("batch", "block", "head"))
        record_strides(rp, dA, ("head",))
        record_strides(rp, dB, ("batch", "seqlen", "group"))
        record_strides(rp, dC, ("batch", "seqlen", "group"))
        if dD is not None:
            if len(dD.shape) == 1:
                rp.update(stride_dD_head=dD.strides[0], stride_dD_dim=0)
            else:
                record_strides(rp, dD, ("head", "dim"))
        if ddt_bias is not None:
            record_strides(rp, ddt_bias, ("head",))
        for grad, share in shared_grads:  # (a share's rows are (row, part of N): its batch stride is a part's)
            rp[grad.name], rp[share.name] = grad.ptr, share.ptr
            record_strides(rp, grad, ("batch", "seqlen", "head"))
            record_strides(rp, share, ("batch", "seqlen", "head"))
        null_absent(rp, SsdBackwardReducePlan.param_names, ("dD", "ddt_bias") + SHARED_GRADS)
        expect_complete(rp, SsdBackwardReducePlan.param_names, "ssd_bwd_reduce")
        reduce_call = BoundCall(constants={"headdim": headdim, "io_dtype": io},
                                grid=(nheads + group_sum_ctas + share_sum_ctas, 1, 1), params=rp,
                                inputs=tuple(a for a in (partials, group_grads) if a is not None)
                                + tuple(share for _, share in shared_grads),
                                outputs=tuple(a for a in (dA, dD, ddt_bias, dB, dC) if a is not None)
                                + tuple(grad for grad, _ in shared_grads))

        # across the steps: no gradient (or the workspace) may overlap an input or another output, since one step
        # writes what a later one reads
        read = (x, dt, A, B, C, D, z, dt_bias, initial_states, initial_state_indices, seq_idx, cu_seqlens, dout,
                dfinal_states)
        written = (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states, workspace)
        check_call(BoundCall({}, (1, 1, 1), {}, tuple(a for a in read if a is not None),
                             tuple(a for a in written if a is not None)))
        # the chunk pass computes y itself (for dz): the recompute is the states-only walk (one pass, no outputs)
        recompute = block_states_call(forward, _rename(views["states"], "block_states"))
        walks = [recompute, ("ssd_bwd_dstates", states_call)]
        if d_state in WALKS_D_STATES and walks_side_by_side(states_call.grid):
            walks = [("ssd_bwd_walks", side_by_side(recompute[1], states_call))]
        return walks + [("ssd_bwd_chunk", chunk_call), ("ssd_bwd_reduce", reduce_call)]
