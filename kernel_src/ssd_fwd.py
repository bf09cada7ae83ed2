"""ssd_fwd: the Mamba-2 chunked SSD forward (prefill, training forward) on tensor cores.

Math (BRIEF §2; the SSD paper's chunked form, arXiv:2405.21060 §6). Per head h, for a block of 64 tokens
with Δ_t = clamp(softplus?(dt_t + dt_bias[h]), lo, hi) and cs_t = Σ_{s ≤ t in block} Δ_s·A[h]·log2(e)::

    S[t, s]  = (C_t · B_s) · 2^(cs_t - cs_s) · Δ_s                        s ≤ t, same sequence
    y_t      = Σ_s S[t, s] · x_s  +  2^(cs_t - cs_0-) · (C_t · h_0)  (+ D ⊙ x_t);   out_t = y_t · silu(z_t)
    h_end    = 2^(cs_end - cs_0-) · h_0  +  Σ_s 2^(cs_end - cs_s) · Δ_s · x_s ⊗ B_s

where h_0 is the state entering the block (the previous block's end state, or the sequence's initial state
at a sequence start) and cs_0- the cumsum just before the block's first token of that sequence. Every
exponent is clamped at 0 (cs is non-increasing for A ≤ 0), so nothing overflows. S is selected to 0 outside
the sequence; rows of x of another sequence sharing the block enter the products with weight 0 (finite
inputs contribute nothing; padding past L is zero-filled).

One CTA owns one (64-row slice of P, head, sequence source) and walks its tokens in blocks of 64 aligned
to the row, carrying the fp32 state h (64 × N) in the MMA accumulators. A block's x, z, B, C are loaded with
cp.async while the block before it finishes, once that block's products are done (B and C in place, x and z into
the other of two buffers). Meanwhile warp 0 computes the block's Δ and cumsums, and the other warps write the
previous block's outputs. The products C·Bᵀ, C·h₀ᵀ (its rows then scaled by e_t = 2^(cs_t - cs_0-) in fp32), S·x
and (Δ-weighted x)ᵀ·B are bf16/fp16 tensor-core MMAs with fp32 accumulation: on sm_90a (N <= 128: one
warpgroup) Hopper warpgroup MMAs reading their operands from the shared tiles (S·x takes the masked S from the
registers that computed it), elsewhere warp MMAs (mma.sync m16n8k16 from ldmatrix fragments, S through shared
memory; sm_100a has no wgmma); h is rounded to the I/O dtype only as an MMA operand for
the C·h₀ᵀ term (as in the Triton kernels), never in the carried state. No per-chunk state goes through HBM (a split
call, below, stores one state per segment).

Sequence sources (the CTA's z index): row z of a (batch, L) input; sequence z of ``cu_seqlens`` (B == 1);
or row z split at every change of ``seq_idx`` (blocks holding a sequence start are processed once per
sequence run). A call the runtime splits along L (never with packed sequences) runs its rows as ``segments`` of
``segment_len`` tokens, each segment starting from the chunk state before it, in the grid (P / 64 · rows, H,
segments): x = row · P / 64 + the slice of P, z = segment (segment-major). It runs in one of two ways. With too
few CTAs for the GPU, in two launches: a states-only pass (``states_only``: the h recurrence alone, its chunk states
being the states entering the later segments; ``kernel_src/ssd_fwd_pass.py``: this class with a walk of its own), then
every segment at once; only the last segment writes the final state and chunk states (the states-only pass wrote the
others; without a workspace for those states, ``kernel_src/ssd_fwd_inline.py`` runs the segments in one launch, each
walking the recurrence alone from its row's start up to its own start). With more CTAs than the GPU runs at once, in
one launch whose segments hand
their states over (``segment_flags``): a segment waits for the flag that the segment before it sets once its end
state is written (as its chunk state; the last segment writes none), and waves of shorter segments leave less of
the last wave empty.
The GPU starts a grid's CTAs in the order of their linear block index (x fastest, then y, then z; CUTLASS's serial
split-K semaphores rely on the same), so the CTA a segment waits for started before it: it runs, or is done. The
chunk size Q only says where ``chunk_states`` are taken (after the last token of every Q-token chunk of the row, Q a
multiple of 64): the algorithm's own block is always 64 tokens.
"""

# (no "from __future__ import annotations": cute.struct reads its field annotations as live objects)
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, f32, i32, ptr, ssm_strides, strides
from kernel_src.families import expect_constants
from kernel_src.ssd_tiles import (CHUNK, SCAN_GROUP, SMEM_ALIGN, TILE, VECTOR, async_tile_copy, block_cumsum, buffer,
                                  fence_operands, load_tile, make_mma, mask_bit, mn_view, next_change, pairs, role_sync,
                                  scale_rows, smem_layout, source_tokens, store_change_bits, store_pairs, store_state,
                                  transposed, vec, vector, view, widen)
from kernel_src.ssm_math import delta_from_dt, silu_approx

P_TILE = 64      # head-dim rows per CTA
LOG2_E = math.log2(math.e)


class SsdForward:
    family = "ssd_fwd"
    grid_rule = "headdim/64,heads,sequences"
    headdims = (64, 128)
    d_states = (64, 128, 256)
    io_dtypes = ("bf16", "fp16")
    state_dtypes = ("fp32", "bf16", "fp16")
    target_arch = None  # set by the build (compile_variant) before compiling
    # ssd_fwd_states (kernel_src/ssd_fwd_states.py) is this class walking block states only: its walk, its extra
    # parameters and its scan group's sequence-change masks
    block_states_walk = False
    states_pass = False       # ssd_fwd_pass (kernel_src/ssd_fwd_pass.py): this class walking a split call's states
    change_slots = 1
    gate_buffers = 2          # z's tiles (the walk with outputs)
    x_tiles, b_tiles = 2, 1   # x's two buffers, B's tile (ssd_fwd_pass: rings of both)
    segment_handover = True   # split calls' segments may hand their states over
    # ssd_fwd_inline (kernel_src/ssd_fwd_inline.py): a split call in one launch (nchunks 0), each segment after the first
    # walking the state recurrence alone from its row's start up to its own
    inline_pass = False
    weighted_x_offset = TILE * TILE  # where the weighted x sits in the scratch (after S, stored there by warp MMAs)
    # Two ways of ssd_fwd_paired's products with fewer instructions (docs/PERF_NOTES.md, twenty-eighth session): the
    # first MMAs overwrite fresh accumulators (wgmma's scale-d off) instead of adding to zeros, and the mask drops
    # only what it must (_mask_scores). The walk keeps the longer code: ptxas schedules it 11-19 % slower with the
    # first, and with the second it spills at N 64 fp16.
    overwrites_accumulators = False
    lean_mask = False

    def __init__(self, headdim: int, d_state: int, io_dtype: str, state_dtype: str):
        expect_constants(self, headdim=headdim, d_state=d_state, io_dtype=io_dtype, state_dtype=state_dtype)
        self.headdim, self.d_state, self.io_dtype, self.state_dtype = headdim, d_state, io_dtype, state_dtype
        self.cluster = (1, 1, 1)

    @property
    def dynamic_smem(self):
        """Bytes of shared memory per CTA (the scan slots follow the target's scan group: set target_arch first)."""
        return self._shared_storage(cutlass_dtype(self.io_dtype)).size_in_bytes()

    # The CTA's shape follows the MMA kind, so it is known once the build has set target_arch.
    def _warpgroup_mma(self):
        """sm_90a up to N = 128: one warpgroup's MMAs read their operands from the shared tiles (sm_100a has no wgmma;
        N = 256 holds a state too large for one warpgroup's registers)."""
        assert self.target_arch is not None, "ssd_fwd's CTA shape follows the target: set target_arch first"
        return self.target_arch == "sm_90a" and self.d_state <= 128

    @property
    def mma_warpgroups(self):
        """Warpgroups side by side along N for the wgmma (``make_mma``), 0 for the warp MMAs."""
        return int(self._warpgroup_mma())

    @property
    def warps(self):
        """(rows, columns) of warps. One warpgroup (2 × 2) for the warpgroup MMAs, two CTAs per SM (one CTA's loads
        and barriers overlap the other's products; ssd_fwd_states aims at three); 4 × 2 for the warp MMAs, one CTA
        per SM: their operand fragments live in registers, which 4 warps holding the whole state cannot spare (ptxas
        spills)."""
        return (2, 2) if self._warpgroup_mma() else (4, 2)

    @property
    def threads(self):
        return self.warps[0] * self.warps[1] * 32

    @property
    def block(self):
        return (self.threads, 1, 1)

    @property
    def product_threads(self):
        """The threads that run a walk's products (and weigh x's rows): the CTA's."""
        return self.threads

    @property
    def scan_group(self):
        """Blocks the states-only pass (ssd_fwd_pass) scans at once (at most SCAN_GROUP, even). Two on the warp-MMA
        CTA: with four warps' raw dt in registers beside its operand fragments, sm_100a's N = 256 spilled."""
        return SCAN_GROUP if self._warpgroup_mma() else 2

    @property
    def min_ctas_per_sm(self):
        return 2 if self._warpgroup_mma() else 1

    def _y_pitches(self):
        """(row pitch, offset of a row's second half), in floats, of the staged y (fp32, 64 columns). On the
        warpgroup-MMA CTA (72, 36): a half-warp's accumulator pair writes (4 rows of 8 banks) fill 32 different
        banks (the row pitch is 8 banks on), and so do the output pass's 16-byte reads of a row's 8 runs (the second
        half 4 banks on); the plain pitch of 68 cost 2-way conflicts on both, 4.6 % of the forward at the 2.7B shape.
        The warp-MMA CTA (sm_100a, and N = 256) keeps (68, 32), unmeasured there."""
        return (72, 36) if self._warpgroup_mma() else (68, 32)

    def _scratch_floats(self):
        """One buffer holds the weighted x (and S, where the warp MMAs read it from shared memory) while the products
        run, then y (fp32)."""
        operands = (TILE * TILE + TILE * P_TILE) * 2
        return max(operands, TILE * self._y_pitches()[0] * 4) // 4

    def params(self):
        io, st = self.io_dtype, self.state_dtype
        rows = 2 * VECTOR   # byte alignment of the arrays moved in 16-byte vectors
        return [
            ptr("x", io, align=rows), ptr("dt", io), ptr("A", "fp32"), ptr("B", io, align=rows),
            ptr("C", io, align=rows), ptr("D", "fp32"), ptr("z", io, align=rows), ptr("dt_bias", "fp32"),
            ptr("out", io, align=rows),
            ptr("initial_states", st), ptr("initial_state_indices", "int32"),
            ptr("final_states", st), ptr("final_state_indices", "int32"),
            ptr("chunk_states", "fp32", align=8), ptr("seq_idx", "int32"), ptr("cu_seqlens", "int32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("heads_per_group"), i32("num_seqs"),
            i32("num_initial_slots"), i32("num_final_slots"), i32("chunk_size"), i32("nchunks"),
            # states_only: 1 for a split call's states-only pass, which the plan dispatches to ssd_fwd_pass (no kernel
            # branches on it: each family's walk is fixed)
            i32("segments"), i32("segment_len"), i32("states_only"),
            *ssm_strides(),
            *strides("initial_states", "slot", "head"), *strides("initial_state_indices", "seq"),
            *strides("final_states", "slot", "head"), *strides("final_state_indices", "seq"),
            *strides("chunk_states", "batch", "chunk", "head"), *strides("seq_idx", "batch", "seqlen"),
            *strides("cu_seqlens", "seq"),
            i32("has_D"), i32("has_z"), i32("has_dt_bias"), i32("dt_softplus"),
            i32("has_initial_states"), i32("has_initial_state_indices"),
            i32("has_final_states"), i32("has_final_state_indices"),
            i32("has_chunk_states"), i32("has_seq_idx"), i32("has_cu_seqlens"),
            f32("dt_min"), f32("dt_max"),
            *self._extra_params(),
        ]

    def _extra_params(self):
        """A split call's handover (module docstring): a flag per CTA of the segments before the last, by linear block
        index; zeroed by the runtime before the launch."""
        return [ptr("segment_flags", "int32"), i32("has_segment_flags")]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        # The grid here only serves the compile: the runtime's plan launches z = batch rows, or one z per sequence
        # with cu_seqlens (grid rule "headdim/64,heads,sequences"); a split call (P / 64 · rows, heads, segments).
        self.kernel(args).launch(grid=[self.headdim // P_TILE, a.nheads, a.batch], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream, min_blocks_per_mp=self.min_ctas_per_sm,
                                 preferred_smem_carveout=0)

    @cute.kernel
    def kernel(self, args: tuple):
        self.walk(bind(self.params(), args), cute.arch.block_idx(),
                  cutlass.utils.SmemAllocator().allocate(self.dynamic_smem, SMEM_ALIGN))

    @cute.jit
    def walk(self, a, block, smem):
        """One CTA's walk: (64-row slice of P, head, row or sequence source) = ``block`` (a split call's: (row · P / 64
        + slice, head, segment)), its shared memory at ``smem`` (ssd_bwd_walks runs it beside another walk, in one
        shared memory)."""
        P, N = self.headdim, self.d_state
        io_type, state_type = cutlass_dtype(self.io_dtype), cutlass_dtype(self.state_dtype)
        ptile, h, source = block
        split_row = 0
        if cutlass.const_expr(self.segment_handover):  # a split call's rows are in x, after the slices of P
            split_row = ptile // (P // P_TILE)
            ptile = ptile % (P // P_TILE)
        tid, _, _ = cute.arch.thread_idx()
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        L, H = a.seqlen, a.nheads
        G = H // a.heads_per_group
        g = h // a.heads_per_group
        p0 = ptile * P_TILE

        x = view(a.x, (a.batch, L, H, P), vec(a.stride_x_batch), vec(a.stride_x_seqlen), vec(a.stride_x_head), 1)
        z = view(a.z, (a.batch, L, H, P), vec(a.stride_z_batch), vec(a.stride_z_seqlen), vec(a.stride_z_head), 1)
        Bm = view(a.B, (a.batch, L, G, N), vec(a.stride_B_batch), vec(a.stride_B_seqlen), vec(a.stride_B_group), 1)
        Cm = view(a.C, (a.batch, L, G, N), vec(a.stride_C_batch), vec(a.stride_C_seqlen), vec(a.stride_C_group), 1)
        dt = view(a.dt, (a.batch, L, H), a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)
        out = view(a.out, (a.batch, L, H, P), vec(a.stride_out_batch), vec(a.stride_out_seqlen),
                   vec(a.stride_out_head), 1)
        D = view(a.D, (H, P), a.stride_D_head, a.stride_D_dim)
        seq_idx = view(a.seq_idx, (a.batch, L), a.stride_seq_idx_batch, a.stride_seq_idx_seqlen)
        states = self._state_views(a)

        # This CTA's tokens: [start, end) of one row (or of one segment of it), and the number of its first sequence;
        # in an inline split the walk begins at ``first``, the row's start, its outputs at start.
        segment = source % a.segments
        source = source // a.segments + split_row
        row, first, start, end = self._walk_tokens(a, source, segment)
        seq = source
        if a.has_seq_idx != 0:
            seq = Int32(0)  # sequences of a seq_idx row are numbered from 0 (the runtime allows states only at B == 1)

        storage = self._shared_storage(io_type)(smem)
        sB = storage.B.get_tensor(smem_layout((TILE, N)))
        sC = storage.C.get_tensor(smem_layout((TILE, N)))
        operands = cute.recast_ptr(storage.scratch.data_ptr(), dtype=io_type)
        sS = cute.make_tensor(operands, smem_layout((TILE, TILE)))
        sXw = cute.make_tensor(operands + self.weighted_x_offset, smem_layout((TILE, P_TILE)))
        row_pitch, half_pitch = self._y_pitches()
        sY = storage.scratch.get_tensor(cute.make_layout((TILE, (P_TILE // 2, 2)), stride=(row_pitch, (1, half_pitch))))
        sD = storage.D.get_tensor(cute.make_layout((P_TILE,)))
        sH = storage.h.get_tensor(smem_layout((P_TILE, N)))
        sDelta = storage.delta.get_tensor(cute.make_layout((TILE,)))
        sCs = storage.cs.get_tensor(cute.make_layout((TILE,)))
        sChanges = storage.changes.get_tensor(cute.make_layout((2,)))

        mma = make_mma(io_type, tid, self.warps, warpgroups=self.mma_warpgroups)
        g2s = async_tile_copy(io_type, self.threads)
        gx = x[row, None, h, None]
        gz = z[row, None, h, None]
        gB = Bm[row, None, g, None]
        gC = Cm[row, None, g, None]
        ident_x = cute.make_identity_tensor((L, P))
        ident_BC = cute.make_identity_tensor((L, N))

        A_log2 = view(a.A, (H,), a.stride_A_head)[h] * Float32(LOG2_E)
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = view(a.dt_bias, (H,), a.stride_dt_bias_head)[h]

        if tid < P_TILE:  # D of this CTA's rows (zero without D); visible after the first block's barrier
            d_value = Float32(0.0)
            if a.has_D != 0:
                d_value = D[h, p0 + tid]
            sD[tid] = d_value

        blk_first, blk_end = self._blocks(first, end)

        acc_h = cute.make_rmem_tensor(mma.thr.partition_shape_C((P_TILE, N)), Float32)
        if self._from_row_start(a, segment):
            self._begin_sequence(a, states, mma, acc_h, sH, seq, h, p0, io_type)
        else:  # the state entering the segment: the chunk state before start, as the states-only pass or the
            # segment before this one left it
            if cutlass.const_expr(self.segment_handover):
                if a.has_segment_flags != 0:
                    self._await_flag(self._segment_flag(a, ptile, h, row, segment - 1), tid)
            entering = states.chunks[row, start // a.chunk_size - 1, h, None, None]
            self._set_state(mma, acc_h, sH, entering, True, p0, io_type)
        sources = (g2s, tid, gx, gz, gB, gC, ident_x, ident_BC, ptile, L)

        if cutlass.const_expr(self.block_states_walk):
            loads = (g2s, tid, gx, gB, ident_x, ident_BC, ptile, L)
            walk = (a, states, mma, acc_h, sXw, sDelta, sCs, sChanges, sH, dt, seq_idx, row, h, p0, start, end, blk_end,
                    bias, A_log2, warp_id, lane)
            self._walk_block_states(walk, loads, blk_first, blk_end, (buffer(storage.x, 0, P_TILE), sB),
                                    (buffer(storage.x, 1, P_TILE), sC), seq, io_type)
        else:
            # Warp 0 keeps the raw dt (and seq_idx) of the next block in registers: rows lane and lane + 32.
            dt_next0 = io_type(0.0)
            dt_next1 = io_type(0.0)
            seq_next0 = Int32(0)
            seq_next1 = Int32(0)
            prev_seq = Int32(0)
            if warp_id == 0:
                if a.has_seq_idx != 0:
                    if start < L:
                        prev_seq = seq_idx[row, start]
                dt_next0, dt_next1, seq_next0, seq_next1 = self._load_raw(a, dt, seq_idx, row, h, blk_first, lane, L)

            if cutlass.const_expr(self.states_pass):  # (ssd_fwd_pass)
                loads = (g2s, tid, gx, gB, ident_x, ident_BC, ptile, L)
                walk = (a, states, mma, acc_h, sXw, sDelta, sCs, sChanges, dt, seq_idx, row, h, p0, start, end,
                        blk_end, bias, A_log2, warp_id, lane)
                self._walk_states(walk, loads, storage, blk_first, blk_end, dt_next0, dt_next1, io_type)
            else:
                # Each block's tiles are loaded, and its Δ scanned by warp 0, while the block before it finishes: two
                # blocks per iteration, so that x and z alternate between their two buffers statically.
                # (on the warp-MMA walk an inline pass is the walk with outputs, none stored before start)
                outputs_walk = (a, states, mma, acc_h, dt, seq_idx, out, row, h, p0, ptile, segment, first, end,
                                blk_first, blk_end, bias, A_log2, tid, warp_id, lane, sources, start)
                smem = (storage, sB, sC, sS, sXw, sY, sH, sD, sDelta, sCs, sChanges)
                for pair in range(blk_first, blk_end, 2):
                    for parity in cutlass.range_constexpr(2):
                        if pair + parity < blk_end:
                            seq, prev_seq, dt_next0, dt_next1, seq_next0, seq_next1 = self._block(
                                outputs_walk, smem, pair + parity, parity, seq, prev_seq, dt_next0, dt_next1,
                                seq_next0, seq_next1, state_type, io_type)

            if segment == a.segments - 1:
                self._end_sequence(a, states, mma, acc_h, seq, h, p0, state_type)
            if cutlass.const_expr(self.segment_handover):
                if (a.has_segment_flags != 0) & (segment < a.segments - 1):
                    self._set_flag(self._segment_flag(a, ptile, h, row, segment), tid)

    @cute.jit
    def _tokens(self, a, source, segment):
        """A walk's row and its tokens [start, end): its sequence source's, or one segment of them."""
        row, start, end = source_tokens(a, source, a.seqlen)
        start = cute.math.max(start, segment * a.segment_len)
        end = cute.math.min(end, start + a.segment_len)
        return row, start, end

    @cute.jit
    def _walk_tokens(self, a, source, segment):
        """(row, first, start, end): the CTA's outputs' tokens [start, end) (:meth:`_tokens`) and the token its walk
        begins at: start, or with an inline pass (:meth:`_from_row_start`) the row's start. (The plan's segments cover
        the row, segments · segment_len >= L, so with an inline pass too the last segment, clamped at segment_len, ends
        at the row's end: ``split_call`` asserts it.)"""
        row, start, end = self._tokens(a, source, segment)
        first = start
        if cutlass.const_expr(self.inline_pass):
            if a.nchunks == 0:
                _, first, _ = source_tokens(a, source, a.seqlen)
        return row, first, start, end

    def _from_row_start(self, a, segment):
        """Whether the CTA's walk begins at its row's start, from the sequence's initial state (the first segment; with
        an inline pass, every segment of a launch with no chunk states, ``nchunks`` 0 as the plan binds an inline
        split), rather than at its segment's, from the chunk state entering it (left by a states-only pass or the
        segment before: the plan sends ssd_fwd_inline those launches too, without z at N 128)."""
        if cutlass.const_expr(self.inline_pass):
            return (segment == 0) | (a.nchunks == 0)
        return segment == 0

    @cute.jit
    def _blocks(self, start, end):
        """The blocks [blk_first, blk_end) that hold tokens [start, end) (none when it is empty)."""
        blk_first = start // TILE
        blk_end = (end + TILE - 1) // TILE
        if end <= start:
            blk_end = blk_first
        return blk_first, blk_end

    def _state_views(self, a):
        """The call's state tensors (:class:`StateViews`), as views of its pointers."""
        P, N, H = self.headdim, self.d_state, a.nheads
        return StateViews(
            initial=view(a.initial_states, (a.num_initial_slots, H, P, N), a.stride_initial_states_slot,
                         a.stride_initial_states_head, N, 1),
            initial_indices=view(a.initial_state_indices, (a.num_seqs,), a.stride_initial_state_indices_seq),
            final=view(a.final_states, (a.num_final_slots, H, P, N), a.stride_final_states_slot,
                       a.stride_final_states_head, N, 1),
            final_indices=view(a.final_state_indices, (a.num_seqs,), a.stride_final_state_indices_seq),
            chunks=view(a.chunk_states, (a.batch, a.nchunks, H, P, N), pairs(a.stride_chunk_states_batch),
                        pairs(a.stride_chunk_states_chunk), pairs(a.stride_chunk_states_head), N, 1),
            blocks=self._block_states_view(a),
        )

    def _segment_flag(self, a, ptile, h, row, segment):
        """The flag segment ``segment`` of (row, head, ptile) sets once its end state is written: its CTA's linear
        block index (x = row · P / 64 + ptile, y = head, z = segment)."""
        ptiles = self.headdim // P_TILE
        return a.segment_flags + ((segment * a.nheads + h) * a.batch + row) * ptiles + ptile

    @cute.jit
    def _await_flag(self, flag, tid):
        """The CTA waits until ``flag`` is set (one thread polls it with acquire loads; the barrier passes that on)."""
        if tid == 0:
            ready = Int32(0)
            while ready == 0:
                ready = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
        cute.arch.sync_threads()

    @cute.jit
    def _set_flag(self, flag, tid):
        """Set ``flag`` once every thread's stores are visible GPU-wide (each fences, then one release store)."""
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        if tid == 0:
            cute.arch.store(flag, Int32(1), sem="release", scope="gpu")

    def _block_states_view(self, a):
        return None

    @cute.jit
    def _block(self, walk, smem, blk, parity: cutlass.Constexpr, seq, prev_seq, dt0, dt1, seq0, seq1,
               state_type: cutlass.Constexpr, io_type: cutlass.Constexpr):
        """One block of the walk with outputs, its tiles in the x / z buffers ``parity``: each sequence segment's
        products, state and outputs. Once its last products are done, the next block's tiles are loaded (x and z into
        the other buffers, B and C in place) and warp 0 scans the next block's Δ while the other warps write the
        outputs. (The first block's loads and scan are made here.) Returns the carried values: the sequence number,
        the seq_idx of the next block's last row, and warp 0's raw dt / seq_idx of the block after next."""
        (a, states, mma, acc_h, _, _, out, row, h, p0, ptile, segment, start, end, blk_first, blk_end, _, _, tid,
         warp_id, _, sources, out_start) = walk
        storage, sB, sC, sS, sXw, sY, sH, sD, sDelta, sCs, sChanges = smem
        sX = buffer(storage.x, parity, P_TILE)
        sZ = buffer(storage.z, parity, P_TILE)
        work = (mma, acc_h, sX, sB, sC, sS, sXw, sY, sH, sDelta, sCs)
        if cutlass.const_expr(parity == 0):  # (the first block is always a pair's first)
            if blk == blk_first:
                self._load_block(a, sources, (sX, sZ, sB, sC), blk)
                if warp_id == 0:
                    prev_seq, dt0, dt1, seq0, seq1 = self._scan_next(walk, smem, blk, prev_seq, dt0, dt1, seq0, seq1)
        cute.arch.cp_async_wait_group(0)
        fence_operands(mma)  # (and h₀ of the last block)
        cute.arch.sync_threads()  # the block's tiles, Δ and cumsums are in shared memory; the last outputs written

        changes_lo = sChanges[0]
        changes_hi = sChanges[1]
        block_start = blk * TILE
        seg = cute.math.max(start, block_start) - block_start
        seg_stop = cute.math.min(end, block_start + TILE) - block_start
        while seg < seg_stop:
            seg_end = cute.math.min(next_change(changes_lo, changes_hi, seg), seg_stop)
            if mask_bit(changes_lo, changes_hi, seg) != 0:
                self._end_sequence(a, states, mma, acc_h, seq, h, p0, state_type)
                seq = seq + 1
                self._begin_sequence(a, states, mma, acc_h, sH, seq, h, p0, io_type)
                fence_operands(mma)
            cute.arch.sync_threads()  # h₀ in shared memory, and every warp done with the last segment
            acc_y = self._products(work, seg, seg_end, tid, io_type)
            self._stage_outputs(work, acc_y, io_type)
            if seg_end == seg_stop:  # the block's products are done: nothing reads its B and C any more
                if blk + 1 < blk_end:
                    next_tiles = (buffer(storage.x, 1 - parity, P_TILE), buffer(storage.z, 1 - parity, P_TILE), sB, sC)
                    self._load_block(a, sources, next_tiles, blk + 1)
            if warp_id == 0:
                # after the block's last products nothing reads its Δ, cumsums or sequence changes any more
                if (seg_end == seg_stop) & (blk + 1 < blk_end):
                    prev_seq, dt0, dt1, seq0, seq1 = self._scan_next(walk, smem, blk + 1, prev_seq, dt0, dt1, seq0,
                                                                     seq1)
            else:
                stored_from = seg
                if cutlass.const_expr(self.inline_pass):
                    stored_from = cute.math.max(seg, out_start - block_start)
                self._store_rows(a, sY, sX, sZ, sD, out, row, h, ptile, block_start, stored_from, seg_end, tid - 32,
                                 io_type)
            seg = seg_end

        # a states-only pass wrote the chunk states of every segment but the last; a handover's segments write theirs
        # but the last (its end state is the final state)
        if (a.has_chunk_states != 0) & ((segment == a.segments - 1) != (a.has_segment_flags != 0)):
            self._store_chunk_state(a, states, mma, acc_h, row, h, p0, block_start + seg_stop - 1, a.seqlen)
        return seq, prev_seq, dt0, dt1, seq0, seq1

    @cute.jit
    def _scan_next(self, walk, smem, blk, prev_seq, dt0, dt1, seq0, seq1):
        """Warp 0 in the walk with outputs: block blk's Δ, cumsums and sequence changes from its raw dt / seq_idx
        (dt0, dt1, seq0, seq1), then block blk + 1's raw values. Returns (block blk's last seq_idx, those raw
        values)."""
        (a, _, _, _, dt, seq_idx, _, row, h, _, _, _, start, end, _, _, bias, A_log2, _, _, lane, _, _) = walk
        _, _, _, _, _, _, _, _, sDelta, sCs, sChanges = smem
        self._scan_block(a, dt0, dt1, blk, start, end, bias, A_log2, sDelta, sCs, lane)
        prev_seq = self._scan_changes(seq0, seq1, prev_seq, blk, end, sChanges, lane)
        dt0, dt1, seq0, seq1 = self._load_raw(a, dt, seq_idx, row, h, blk + 1, lane, a.seqlen)
        return prev_seq, dt0, dt1, seq0, seq1

    def _shared_storage(self, io_type):
        N = self.d_state

        @cute.struct
        class SharedStorage:
            x: cute.struct.Align[cute.struct.MemRange[io_type, self.x_tiles * TILE * P_TILE], SMEM_ALIGN]
            z: cute.struct.Align[cute.struct.MemRange[io_type, self.gate_buffers * TILE * P_TILE], SMEM_ALIGN]
            B: cute.struct.Align[cute.struct.MemRange[io_type, self.b_tiles * TILE * N], SMEM_ALIGN]
            C: cute.struct.Align[cute.struct.MemRange[io_type, TILE * N], SMEM_ALIGN]
            scratch: cute.struct.Align[cute.struct.MemRange[Float32, self._scratch_floats()], SMEM_ALIGN]
            h: cute.struct.Align[cute.struct.MemRange[io_type, P_TILE * N], SMEM_ALIGN]
            D: cute.struct.Align[cute.struct.MemRange[Float32, P_TILE], SMEM_ALIGN]
            # a scan group's Δ and cumsums, a slot per block of the group, no more (sm_120a's N = 128 fits its 99 KB per
            # CTA only with the warp-MMA CTA's two); the walk with outputs uses the first
            delta: cute.struct.Align[cute.struct.MemRange[Float32, self.scan_group * TILE], SMEM_ALIGN]
            cs: cute.struct.Align[cute.struct.MemRange[Float32, self.scan_group * TILE], SMEM_ALIGN]
            changes: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.change_slots], SMEM_ALIGN]

        return SharedStorage

    @cute.jit
    def _load_block(self, a, sources, tiles, blk):
        """cp.async the block's x and z (their P slice), B and C rows into the shared ``tiles`` (one commit group);
        rows past L become zeros."""
        g2s, tid, gx, gz, gB, gC, ident_x, ident_BC, ptile, L = sources
        sX, sZ, sB, sC = tiles
        thr = g2s.get_slice(tid)
        load_tile(g2s, thr, gx, ident_x, sX, (TILE, P_TILE), (blk, ptile), L)
        if a.has_z != 0:
            load_tile(g2s, thr, gz, ident_x, sZ, (TILE, P_TILE), (blk, ptile), L)
        load_tile(g2s, thr, gB, ident_BC, sB, (TILE, self.d_state), (blk, 0), L)
        load_tile(g2s, thr, gC, ident_BC, sC, (TILE, self.d_state), (blk, 0), L)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _load_raw(self, a, dt, seq_idx, row, h, blk, lane, L):
        """Warp 0: the raw dt and seq_idx of a block's rows lane and lane + 32 (zeros past L). dt stays in the I/O
        dtype until the block's scan converts it: a conversion here would wait for the load."""
        dt0 = dt.element_type(0.0)
        dt1 = dt.element_type(0.0)
        s0 = Int32(0)
        s1 = Int32(0)
        tok = blk * TILE + lane
        if tok < L:
            dt0 = dt[row, tok, h]
            if a.has_seq_idx != 0:
                s0 = seq_idx[row, tok]
        if tok + 32 < L:
            dt1 = dt[row, tok + 32, h]
            if a.has_seq_idx != 0:
                s1 = seq_idx[row, tok + 32]
        return dt0, dt1, s0, s1

    @cute.jit
    def _scan_block(self, a, dt0, dt1, blk, start, end, bias, A_log2, sDelta, sCs, lane):
        """A warp: Δ and the inclusive cumsum of Δ·A·log2(e) of the block's 64 rows (Δ = 0 outside [start, end))."""
        tok0 = blk * TILE + lane
        tok1 = tok0 + 32
        d0 = Float32(0.0)
        d1 = Float32(0.0)
        if tok0 >= start:
            if tok0 < end:
                d0 = delta_from_dt(dt0.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
        if tok1 >= start:
            if tok1 < end:
                d1 = delta_from_dt(dt1.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
        c0, c1 = block_cumsum(d0, d1, A_log2, lane)
        sDelta[lane] = d0
        sDelta[lane + 32] = d1
        sCs[lane] = c0
        sCs[lane + 32] = c1

    @cute.jit
    def _scan_changes(self, s0, s1, prev_seq, blk, end, sChanges, lane):
        """A warp: the bit mask of the block's rows where seq_idx changes (its rows lane and lane + 32 hold s0, s1).
        Returns the seq_idx of the block's last row."""
        tok0 = blk * TILE + lane
        tok1 = tok0 + 32
        last0 = cute.arch.shuffle_sync(s0, 31)
        before0 = cute.arch.shuffle_sync_up(s0, 1)
        before1 = cute.arch.shuffle_sync_up(s1, 1)
        if lane == 0:
            before0 = prev_seq
            before1 = last0
        change0 = Int32(0)
        change1 = Int32(0)
        if tok0 < end:
            if s0 != before0:
                change0 = Int32(1)
        if tok1 < end:
            if s1 != before1:
                change1 = Int32(1)
        store_change_bits(change0, change1, sChanges, lane)
        return cute.arch.shuffle_sync(s1, 31)

    @cute.jit
    def _products(self, work, s0, s1, tid, io_type: cutlass.Constexpr, walk_barrier=None):
        """Rows [s0, s1) of the block (one sequence): y (before D and the gate) and h advanced past them, in the
        accumulators; when it returns, no MMA reads the block's tiles or the scratch operands any more (the
        outputs still read x).

        y = e ⊙ (C · h₀ᵀ) + S · x (e_i = the entering state's decay to row i, applied to the accumulator's rows),
        one accumulator beside h and S. Per-row and per-column values of a thread's fragment are read once, and
        masks are selects. The warps that run them synchronize on ``walk_barrier`` (a named barrier of
        ``product_threads``; ssd_fwd_paired's product warpgroups), or, by default, on the CTA's barrier."""
        mma, acc_h, sX, sB, sC, sS, sXw, _, sH, sDelta, sCs = work
        base, cs_end = self._run_cumsums(sCs, s0, s1)
        fresh = self.overwrites_accumulators
        acc_s = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        acc_y = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P_TILE)), Float32)
        if cutlass.const_expr(not fresh):
            acc_s.fill(0.0)
            acc_y.fill(0.0)
        mma.gemm(acc_s, sC, sB, self.d_state // 16, wait=False, accumulate=not fresh)
        self._weigh_rows(sX, sXw, sDelta, sCs, s0, s1, cs_end, tid, io_type)  # while C·Bᵀ runs (sm_90a)
        mma.wait()
        if cutlass.const_expr(mma.asynchronous):
            mma.gemm(acc_y, sC, sH, self.d_state // 16, wait=False, accumulate=not fresh)  # while S is masked
            self._mask_scores(mma, acc_s, sDelta, sCs, s0, s1)
            scores = mma.accumulator_operand(acc_s, TILE)
            mma.wait()
            self._decay_rows(mma, acc_y, sCs, base)
            # S·x from S in registers needs no other warp's work: it runs while the barrier publishes the weighted x
            # (h's update, in _advance_state, waits for both products before anyone reads acc_y)
            mma.gemm_registers(acc_y, scores, transposed(sX, TILE, P_TILE), TILE // 16, wait=False)
            fence_operands(mma)
            self._walk_sync(walk_barrier)  # the weighted x is complete
        else:  # (one accumulator fewer is live during the mask)
            self._mask_scores(mma, acc_s, sDelta, sCs, s0, s1)
            store_pairs(mn_view(acc_s), mn_view(mma.thr.partition_C(sS)), io_type)
            mma.gemm(acc_y, sC, sH, self.d_state // 16, accumulate=not fresh)
            self._decay_rows(mma, acc_y, sCs, base)
            self._walk_sync(walk_barrier)  # S and the weighted x are complete
            mma.gemm(acc_y, sS, transposed(sX, TILE, P_TILE), TILE // 16, b_transposed=True)
        self._advance_state(mma, acc_h, sXw, sB, base, cs_end)
        self._walk_sync(walk_barrier)  # every warp done reading the scratch operands and h₀
        return acc_y

    def _walk_sync(self, walk_barrier):
        """The products' barrier: the CTA's, or the named barrier ``walk_barrier`` of ``product_threads``."""
        if cutlass.const_expr(walk_barrier is None):
            cute.arch.sync_threads()
        else:
            role_sync(walk_barrier, self.product_threads)

    @cute.jit
    def _stage_outputs(self, work, acc_y, io_type: cutlass.Constexpr):
        """y (over the scratch) and h₀ of the next segment to shared memory, for the row-wise output pass."""
        mma, acc_h, _, _, _, _, _, sY, sH, _, _ = work
        store_pairs(mn_view(acc_y), mn_view(mma.thr.partition_C(sY)), Float32)
        store_pairs(mn_view(acc_h), mn_view(mma.thr.partition_C(sH)), io_type)
        cute.arch.sync_threads()

    @cute.jit
    def _weigh_rows(self, sX, sXw, sDelta, sCs, s0, s1, cs_end, tid, io_type: cutlass.Constexpr):
        """sXw = Δ_s 2^(cs_end - cs_s) x_s on rows [s0, s1), zero elsewhere: this thread's share of a row, in
        16-byte vectors."""
        per_row = self.product_threads // TILE
        s = tid // per_row
        zero = Float32(0.0)
        weight = Float32(cutlass.select_((s >= s0) & (s < s1), cute.math.exp2(cute.math.min(cs_end - sCs[s], zero),
                                                                             fastmath=True) * sDelta[s], zero))
        scale_rows([(sX, sXw, weight)], s, tid % per_row, per_row, io_type)

    @cute.jit
    def _advance_state(self, mma, acc_h, sXw, sB, base, cs_end, wait: cutlass.Constexpr = True):
        """h = 2^(cs_end - base) h + (weighted x)ᵀ · B: the state past the rows weighed by :meth:`_weigh_rows`
        (without ``wait`` the product runs on: ``mma.wait()`` before h is read)."""
        state_decay = cute.math.exp2(cute.math.min(cs_end - base, Float32(0.0)), fastmath=True)
        for e in cutlass.range_constexpr(cute.size(acc_h)):
            acc_h[e] = acc_h[e] * state_decay
        mma.gemm(acc_h, transposed(sXw, TILE, P_TILE), transposed(sB, TILE, self.d_state), TILE // 16,
                 a_transposed=True, b_transposed=True, wait=wait)

    @cute.jit
    def _load_states_tiles(self, loads, buffers, blk, commit: cutlass.Constexpr = True):
        """cp.async block blk's x and B into ``buffers`` (the states-only walks'), one commit group unless not
        ``commit``."""
        g2s, tid, gx, gB, ident_x, ident_BC, ptile, L = loads
        sX, sB = buffers
        thr = g2s.get_slice(tid)
        load_tile(g2s, thr, gx, ident_x, sX, (TILE, P_TILE), (blk, ptile), L)
        load_tile(g2s, thr, gB, ident_BC, sB, (TILE, self.d_state), (blk, 0), L)
        if cutlass.const_expr(commit):
            cute.arch.cp_async_commit_group()

    @cute.jit
    def _run_cumsums(self, sCs, s0, s1):
        """The cumsums bounding rows [s0, s1) of a block: before row s0 (0 at the block's start) and at row s1 - 1."""
        base = Float32(0.0)
        if s0 > 0:
            base = sCs[s0 - 1]
        return base, sCs[s1 - 1]

    @cute.jit
    def _store_chunk_state(self, a, states, mma, acc_h, row, h, p0, last, L):
        """h as the chunk state of token ``last``'s chunk, when ``last`` ends it (the chunk's or the row's last)."""
        chunk = last // a.chunk_size
        if last == cute.math.min(chunk * a.chunk_size + a.chunk_size - 1, L - 1):
            store_state(states.chunks[row, chunk, h, None, None], mma, acc_h, p0, Float32, paired=True)

    @cute.jit
    def _mask_scores(self, mma, acc_s, sDelta, sCs, s0, s1):
        """S = C·Bᵀ (in acc_s) ⊙ 2^(cs_i - cs_j) Δ_j on s0 <= j <= i < s1 (zero elsewhere), in place; with
        ``lean_mask``, zero above the diagonal only (module docstring of ssd_fwd_paired: Δ_j is zero before the run,
        rows past it are not stored), the causal mask (j > i) an exponent of -inf (a select of S itself ptxas applies
        after the rounding to the I/O dtype, on packed halves)."""
        zero = Float32(0.0)
        S = mn_view(acc_s)
        S_coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, TILE))))
        cols = cute.size(S, mode=[1])
        cs_cols = cute.make_rmem_tensor((cols,), Float32)
        delta_cols = cute.make_rmem_tensor((cols,), Float32)
        for c in cutlass.range_constexpr(cols):
            j = S_coords[0, c][1]
            cs_cols[c] = sCs[j]
            if cutlass.const_expr(self.lean_mask):
                delta_cols[c] = sDelta[j]
            else:
                delta_cols[c] = Float32(cutlass.select_(j >= s0, sDelta[j], zero))
        for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
            i = S_coords[r, 0][0]
            cs_i = sCs[i]
            if cutlass.const_expr(not self.lean_mask):
                in_rows = i < s1
            for c in cutlass.range_constexpr(cols):
                j = S_coords[0, c][1]
                if cutlass.const_expr(self.lean_mask):
                    exponent = Float32(cutlass.select_(j <= i, cute.math.min(cs_i - cs_cols[c], zero), -math.inf))
                    S[r, c] = S[r, c] * cute.math.exp2(exponent, fastmath=True) * delta_cols[c]
                else:
                    decay = cute.math.exp2(cute.math.min(cs_i - cs_cols[c], zero), fastmath=True)
                    keep = in_rows & (j <= i)
                    S[r, c] = Float32(cutlass.select_(keep, S[r, c] * decay * delta_cols[c], zero))

    @cute.jit
    def _decay_rows(self, mma, acc_y, sCs, base):
        """acc_y's row i times 2^(cs_i - base): C·h₀ᵀ as the entering state's contribution to row i."""
        Y = mn_view(acc_y)
        Y_coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, P_TILE))))
        for r in cutlass.range_constexpr(cute.size(Y, mode=[0])):
            decay = cute.math.exp2(cute.math.min(sCs[Y_coords[r, 0][0]] - base, Float32(0.0)), fastmath=True)
            for c in cutlass.range_constexpr(cute.size(Y, mode=[1])):
                Y[r, c] = Y[r, c] * decay

    @cute.jit
    def _store_rows(self, a, sY, sX, sZ, sD, out, row, h, ptile, block_start, s0, s1, worker, io_type):
        """out = (y + D ⊙ x) · silu(z) for rows [s0, s1), by the warps after the first (``worker`` counts their
        threads): runs of 8 columns, read and written as vectors, dealt out in turn."""
        rows = out[row, None, h, None]
        if a.has_z != 0:
            self._store_runs(sY, sX, sZ, sD, rows, ptile, block_start, s0, s1, worker, True, io_type)
        else:
            self._store_runs(sY, sX, sZ, sD, rows, ptile, block_start, s0, s1, worker, False, io_type)

    @cute.jit
    def _store_runs(self, sY, sX, sZ, sD, rows, ptile, block_start, s0, s1, worker, gated: cutlass.Constexpr,
                    io_type: cutlass.Constexpr):
        workers = self.threads - 32
        runs = P_TILE // CHUNK
        items = TILE * runs
        # every item's tiles read first, outside the row test (a load under a branch cannot be moved above the
        # stores before it, so each item's shared-memory latency was exposed in turn); the last round's surplus
        # workers read the last item and store nothing. The workers are a multiple of a row's runs, so a worker's
        # items share one run of columns: D's is read once (a surplus item's y pairs another run's x with it, and
        # is never stored).
        assert workers % runs == 0, "a worker's items must share a run of columns (D is read once)"
        d = vector(sD, worker % runs).load()
        loaded = []
        for k in cutlass.range_constexpr((items + workers - 1) // workers):
            item = cute.math.min(worker + k * workers, Int32(items - 1))
            s, run = item // runs, item % runs
            z = vector(sZ[s, None], run).load() if cutlass.const_expr(gated) else None
            loaded.append((vector(sY[s, None], run).load(), vector(sX[s, None], run).load(), z))
        for k in cutlass.range_constexpr((items + workers - 1) // workers):
            item = worker + k * workers
            s, run = item // runs, item % runs
            y_part, x, z = loaded[k]
            y = cute.make_rmem_tensor((CHUNK,), Float32)
            y.store(y_part + d * widen(x))
            if cutlass.const_expr(gated):
                gate = cute.make_rmem_tensor((CHUNK,), Float32)
                gate.store(widen(z))
                for e in cutlass.range_constexpr(CHUNK):
                    y[e] = y[e] * silu_approx(gate[e])
            if (item < items) & (s >= s0) & (s < s1):
                vector(rows[block_start + s, None], ptile * runs + run).store(y.load().to(io_type))

    @cute.jit
    def _begin_sequence(self, a, states, mma, acc_h, sH, seq, h, p0, io_type, staged: cutlass.Constexpr = True):
        """h = the sequence's initial state (zero if none, or if its index is out of range), also into sH when
        ``staged`` (the next products' h₀)."""
        slot = seq
        valid = Int32(0)
        if a.has_initial_states != 0:
            if seq < a.num_seqs:
                if a.has_initial_state_indices != 0:
                    slot = states.initial_indices[seq]
                if slot >= 0:
                    if slot < a.num_initial_slots:
                        valid = Int32(1)
        self._set_state(mma, acc_h, sH, states.initial[slot, h, None, None], valid != 0, p0, io_type, staged)

    @cute.jit
    def _set_state(self, mma, acc_h, sH, block, valid, p0, io_type, staged: cutlass.Constexpr = True):
        """h = rows p0... of a P × N state block (zero unless valid), also into sH in the I/O dtype when
        ``staged``."""
        coords = mma.thr.partition_C(cute.make_identity_tensor((P_TILE, self.d_state)))
        part_H = mma.thr.partition_C(sH)
        for e in cutlass.range_constexpr(cute.size(acc_h)):
            v = Float32(0.0)
            if valid:
                v = block[p0 + coords[e][0], coords[e][1]].to(Float32)
            acc_h[e] = v
            if cutlass.const_expr(staged):
                part_H[e] = v.to(io_type)

    @cute.jit
    def _end_sequence(self, a, states, mma, acc_h, seq, h, p0, state_type):
        """Write h as the sequence's final state (skipped for an index that is negative or out of range)."""
        if a.has_final_states != 0:
            if seq < a.num_seqs:
                slot = seq
                if a.has_final_state_indices != 0:
                    slot = states.final_indices[seq]
                if slot >= 0:
                    if slot < a.num_final_slots:
                        store_state(states.final[slot, h, None, None], mma, acc_h, p0, state_type)


class StateViews:
    """The state tensors of a call, by role (a plain holder: passed whole to the helpers)."""

    def __init__(self, initial, initial_indices, final, final_indices, chunks, blocks):
        self.initial, self.initial_indices = initial, initial_indices
        self.final, self.final_indices, self.chunks, self.blocks = final, final_indices, chunks, blocks
