"""ssd_bwd_dstates: the backward's reverse pass over the state gradient (the first kernel of ``ssd_bwd``).

Math (BRIEF §2; the adjoint of the forward's block recurrence in kernel_src/ssd_fwd.py). For one sequence run
[s0, s1) of a 64-token block with entering state h₀ and leaving state h_end, cs the block cumsum of Δ·A·log2(e)
and base the cumsum just before s0::

    h_end = 2^(cs_end - base) · h₀ + Σ_s 2^(cs_end - cs_s) Δ_s · x_s ⊗ B_s ,   y_i ∋ 2^(cs_i - base) · C_i · h₀

so with G = dout ⊙ silu(z) (dout where there is no z), the gradient of the loss with respect to h₀ is::

    dh₀ = 2^(cs_end - base) · dh_end + Σ_i 2^(cs_i - base) · G_i ⊗ C_i          (P × N)

One CTA owns one (64-row slice of P, head, sequence source), like the forward, and walks its blocks and runs
backwards carrying dh (fp32, in the MMA accumulators): at a sequence's last token dh starts from
``dfinal_states`` (zero if absent); after the block's last token it is stored to ``dstates[row, block]`` in the
I/O dtype (the gradient of the state the forward stores in its 64-token ``chunk_states``; ssd_bwd_chunk's
products take it in that dtype, and half the bytes of fp32 cross HBM); at a sequence's first token it is that
sequence's ``dinitial_states``. The product (e ⊙ G)ᵀ·C is a bf16 / fp16 MMA with fp32 accumulation: wgmma on
sm_90a up to N = 128, warp MMAs elsewhere.
"""

# (no "from __future__ import annotations": cute.struct reads its field annotations as live objects)
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, f32, i32, ptr, strides
from kernel_src.families import expect_constants
from kernel_src.ssd_tiles import (CHUNK, SCAN_GROUP, SMEM_ALIGN, TILE, VECTOR, async_tile_copy, block_cumsum, buffer,
                                  count_changes, fence_operands, load_raw_block, load_state, load_tile, make_mma,
                                  mask_bit, previous_change, scan_slot, smem_layout, source_tokens, store_change_mask,
                                  store_state, store_state_vectors, transposed, vec, view, widen)
from kernel_src.ssm_math import delta_from_dt, silu

P_TILE = 64
LOG2_E = math.log2(math.e)


class SsdBackwardStates:
    family = "ssd_bwd_dstates"
    grid_rule = "headdim/64,heads,sequences"
    headdims = (64, 128)
    d_states = (64, 128, 256)
    io_dtypes = ("bf16", "fp16")
    target_arch = None  # set by the build (compile_variant) before compiling

    def __init__(self, headdim: int, d_state: int, io_dtype: str):
        expect_constants(self, headdim=headdim, d_state=d_state, io_dtype=io_dtype)
        self.headdim, self.d_state, self.io_dtype = headdim, d_state, io_dtype
        self.warps = (2, 2) if d_state <= 128 else (4, 2)   # the dh accumulator's size: 4 warps hold it to N = 128
        self.threads = self.warps[0] * self.warps[1] * 32
        self.block = (self.threads, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = self._shared_storage(cutlass_dtype(io_dtype)).size_in_bytes()

    def params(self):
        io = self.io_dtype
        rows = 2 * VECTOR   # byte alignment of the arrays moved in 16-byte vectors
        return [
            ptr("dout", io, align=rows), ptr("z", io, align=rows), ptr("dt", io), ptr("A", "fp32"),
            ptr("C", io, align=rows), ptr("dt_bias", "fp32"),
            ptr("dfinal_states", "fp32"), ptr("dinitial_states", "fp32"), ptr("dstates", io, align=rows),
            ptr("seq_idx", "int32"), ptr("cu_seqlens", "int32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("heads_per_group"), i32("num_seqs"), i32("nblocks"),
            *strides("dout", "batch", "seqlen", "head"), *strides("z", "batch", "seqlen", "head"),
            *strides("dt", "batch", "seqlen", "head"), *strides("A", "head"),
            *strides("C", "batch", "seqlen", "group"), *strides("dt_bias", "head"),
            *strides("dfinal_states", "seq", "head"), *strides("dinitial_states", "seq", "head"),
            *strides("dstates", "batch", "block", "head"), *strides("seq_idx", "batch", "seqlen"),
            *strides("cu_seqlens", "seq"),
            i32("has_z"), i32("has_dt_bias"), i32("dt_softplus"), i32("has_dfinal_states"),
            i32("has_dinitial_states"), i32("has_seq_idx"), i32("has_cu_seqlens"),
            f32("dt_min"), f32("dt_max"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[self.headdim // P_TILE, a.nheads, a.batch], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream, min_blocks_per_mp=self.min_ctas_per_sm,
                                 preferred_smem_carveout=0)

    def _warpgroup_mma(self):
        """sm_90a up to N = 128 (4 warps, one warpgroup): wgmma reads both operands from the shared tiles, no
        ldmatrix fragments in registers, so three CTAs fit an SM (their barriers and loads overlap)."""
        assert self.target_arch is not None, "ssd_bwd_dstates' MMAs follow the target: set target_arch first"
        return self.target_arch == "sm_90a" and self.d_state <= 128

    @property
    def min_ctas_per_sm(self):
        return 3 if self._warpgroup_mma() else 1

    @cute.kernel
    def kernel(self, args: tuple):
        self.walk(bind(self.params(), args), cute.arch.block_idx(),
                  cutlass.utils.SmemAllocator().allocate(self.dynamic_smem, SMEM_ALIGN))

    @cute.jit
    def walk(self, a, block, smem):
        """One CTA's reverse walk: (64-row slice of P, head, sequence source) = ``block``, its shared memory
        at ``smem`` (ssd_bwd_walks runs it beside another walk, in one shared memory)."""
        P, N = self.headdim, self.d_state
        io_type = cutlass_dtype(self.io_dtype)
        ptile, h, source = block
        tid, _, _ = cute.arch.thread_idx()
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        L, H = a.seqlen, a.nheads
        G = H // a.heads_per_group
        g = h // a.heads_per_group
        p0 = ptile * P_TILE

        dout = view(a.dout, (a.batch, L, H, P), vec(a.stride_dout_batch), vec(a.stride_dout_seqlen),
                    vec(a.stride_dout_head), 1)
        z = view(a.z, (a.batch, L, H, P), vec(a.stride_z_batch), vec(a.stride_z_seqlen), vec(a.stride_z_head), 1)
        Cm = view(a.C, (a.batch, L, G, N), vec(a.stride_C_batch), vec(a.stride_C_seqlen), vec(a.stride_C_group), 1)
        dt = view(a.dt, (a.batch, L, H), a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)
        seq_idx = view(a.seq_idx, (a.batch, L), a.stride_seq_idx_batch, a.stride_seq_idx_seqlen)
        dfinal = view(a.dfinal_states, (a.num_seqs, H, P, N), a.stride_dfinal_states_seq,
                      a.stride_dfinal_states_head, N, 1)
        dinitial = view(a.dinitial_states, (a.num_seqs, H, P, N), a.stride_dinitial_states_seq,
                        a.stride_dinitial_states_head, N, 1)
        dstates = view(a.dstates, (a.batch, a.nblocks, H, P, N), vec(a.stride_dstates_batch),
                       vec(a.stride_dstates_block), vec(a.stride_dstates_head), N, 1)

        row, start, end = source_tokens(a, source, L)
        seq = source
        if a.has_seq_idx != 0:
            seq = count_changes(seq_idx, row, start, end, lane)  # the row's last sequence

        storage = self._shared_storage(io_type)(smem)
        sGe = storage.gated.get_tensor(smem_layout((TILE, P_TILE)))
        sCs = storage.cs.get_tensor(cute.make_layout((TILE,)))
        sChanges = storage.changes.get_tensor(cute.make_layout((2,)))

        mma = make_mma(io_type, tid, self.warps, warpgroups=int(self._warpgroup_mma()))
        g2s = async_tile_copy(io_type, self.threads)
        thr = g2s.get_slice(tid)

        A_log2 = view(a.A, (H,), a.stride_A_head)[h] * Float32(LOG2_E)
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = view(a.dt_bias, (H,), a.stride_dt_bias_head)[h]

        blk_first = start // TILE
        blk_count = (end + TILE - 1) // TILE - blk_first
        if end <= start:
            blk_count = Int32(0)
        acc = cute.make_rmem_tensor(mma.thr.partition_shape_C((P_TILE, N)), Float32)
        acc.fill(0.0)
        # warp w < SCAN_GROUP scans block w of each scan group (the walk goes backwards: the w-th block before the
        # group's first), loading its dt and seq_idx a group ahead (the other warps of an 8-warp CTA never use
        # theirs); every thread loads its share of a block's tiles into the other buffer a block ahead
        dt0, dt1, here0, before0, here1, before1 = load_raw_block(
            a, dt, seq_idx, row, h, (blk_first + blk_count - 1 - warp_id) * TILE, start, end, lane)

        sources = (dout[row, None, h, None], z[row, None, h, None], Cm[row, None, g, None])
        # whether a sequence starts at the first row of the block walked last (the next one along L): the sequence
        # in this block's last row then ends there, which this block's own change mask does not show
        next_block_starts_sequence = Int32(0)
        if blk_count > 0:
            self._load_tiles(a, g2s, thr, sources, storage, blk_first + blk_count - 1, ptile, Int32(0))
        cute.arch.cp_async_commit_group()
        for i in range(blk_count):
            blk = blk_first + blk_count - 1 - i
            block_start = blk * TILE
            cute.arch.sync_threads()  # every warp done with the previous block's tiles: their buffer is the next's
            if i + 1 < blk_count:
                self._load_tiles(a, g2s, thr, sources, storage, blk - 1, ptile, (i + 1) % 2)
            cute.arch.cp_async_commit_group()
            sDout, sZ, sC = self._tiles(storage, i % 2)
            if i % SCAN_GROUP == 0:  # (every warp is done with the last group's slots: the barrier above)
                if warp_id < SCAN_GROUP:
                    self._scan_block(a, (dt0, dt1, here0, before0, here1, before1), block_start - warp_id * TILE,
                                     start, end, bias, A_log2, scan_slot(sCs, warp_id), scan_slot(sChanges, warp_id),
                                     lane)
                    dt0, dt1, here0, before0, here1, before1 = load_raw_block(
                        a, dt, seq_idx, row, h, block_start - (warp_id + SCAN_GROUP) * TILE, start, end, lane)
            cute.arch.cp_async_wait_group(1)  # this block's tiles (the next block's may still be in flight)
            cute.arch.sync_threads()  # (each run's proxy fence covers the C tile too, before its product)

            slot_cs = scan_slot(sCs, i % SCAN_GROUP)
            slot_changes = scan_slot(sChanges, i % SCAN_GROUP)
            changes_lo = slot_changes[0]
            changes_hi = slot_changes[1]
            seg_first = cute.math.max(start, block_start) - block_start
            s1 = cute.math.min(end, block_start + TILE) - block_start
            block_last = cute.math.min(block_start + TILE, L) - block_start
            block_end = s1  # (the first run walked ends here: the barrier above orders its gating)
            while s1 > seg_first:
                s0 = cute.math.max(previous_change(changes_lo, changes_hi, s1 - 1), seg_first)
                ends_sequence = Int32(0)
                if block_start + s1 == end:
                    ends_sequence = Int32(1)
                if s1 < TILE:
                    ends_sequence = ends_sequence | mask_bit(changes_lo, changes_hi, s1)
                else:
                    ends_sequence = ends_sequence | next_block_starts_sequence
                if ends_sequence != 0:
                    valid = Int32(0)
                    if a.has_dfinal_states != 0:
                        if seq < a.num_seqs:
                            valid = Int32(1)
                    load_state(acc, mma, dfinal[cute.math.min(seq, a.num_seqs - 1), h, None, None], p0, valid)
                self._run(a, mma, acc, sDout, sZ, sGe, sC, slot_cs, s0, s1, s1 < block_end, tid, io_type,
                          (dstates[row, blk, h, None, None], p0, s1 == block_last))

                starts_sequence = mask_bit(changes_lo, changes_hi, s0)
                if block_start + s0 == start:
                    starts_sequence = Int32(1)
                if starts_sequence != 0:
                    if a.has_dinitial_states != 0:
                        if seq < a.num_seqs:
                            store_state(dinitial[seq, h, None, None], mma, acc, p0, Float32)
                    if a.has_seq_idx != 0:
                        seq = seq - 1
                next_block_starts_sequence = starts_sequence  # (the block's last run walked starts at its row 0)
                s1 = s0

        if end <= start:  # an empty sequence: its final state is its initial one
            if a.has_dinitial_states != 0:
                if seq < a.num_seqs:
                    load_state(acc, mma, dfinal[seq, h, None, None], p0, a.has_dfinal_states)
                    store_state(dinitial[seq, h, None, None], mma, acc, p0, Float32)

    @cute.jit
    def _run(self, a, mma, acc, sDout, sZ, sGe, sC, sCs, s0, s1, later_run, tid, io_type: cutlass.Constexpr,
             state_out):
        """dh ← 2^(cs_end - base) · dh + (e ⊙ G)ᵀ·C over the rows [s0, s1) of the block (``later_run``: not the
        first run of the block walked); ``state_out`` = (dst, p0, stores): dh before the run into dst when stores
        (the state gradient at the block's end)."""
        base = Float32(0.0)
        if s0 > 0:
            base = sCs[s0 - 1]
        cs_end = sCs[s1 - 1]
        if later_run:
            cute.arch.sync_threads()  # every warp done reading the last run's scaled rows
        self._gated_rows(a, sDout, sZ, sGe, sCs, base, s0, s1, tid, io_type)
        fence_operands(mma)
        # stored after the proxy fence, whose MEMBAR would wait for these stores to land
        dst, p0, stores = state_out
        if stores:
            store_state_vectors(dst, mma, acc, p0, io_type)
        cute.arch.sync_threads()
        decay = cute.math.exp2(cute.math.min(cs_end - base, Float32(0.0)), fastmath=True)
        for e in cutlass.range_constexpr(cute.size(acc)):
            acc[e] = acc[e] * decay
        mma.gemm(acc, transposed(sGe, TILE, P_TILE), transposed(sC, TILE, self.d_state), TILE // 16,
                 a_transposed=True, b_transposed=True)

    def _shared_storage(self, io_type):
        N = self.d_state

        # dout, z and C twice: a block's tiles load while the block walked before it (the next one along L) is walked
        @cute.struct
        class SharedStorage:
            dout: cute.struct.Align[cute.struct.MemRange[io_type, 2 * TILE * P_TILE], SMEM_ALIGN]
            z: cute.struct.Align[cute.struct.MemRange[io_type, 2 * TILE * P_TILE], SMEM_ALIGN]
            C: cute.struct.Align[cute.struct.MemRange[io_type, 2 * TILE * N], SMEM_ALIGN]
            gated: cute.struct.Align[cute.struct.MemRange[io_type, TILE * P_TILE], SMEM_ALIGN]
            # a scan group's cumsums and sequence-change masks
            cs: cute.struct.Align[cute.struct.MemRange[Float32, SCAN_GROUP * TILE], SMEM_ALIGN]
            changes: cute.struct.Align[cute.struct.MemRange[Int32, SCAN_GROUP * 2], SMEM_ALIGN]

        return SharedStorage

    @cute.jit
    def _load_tiles(self, a, g2s, thr, sources, storage, blk, ptile, index):
        """cp.async of block blk's dout, z and C (``sources``: the row's views) into a buffer (not committed)."""
        L = a.seqlen
        dout, z, C = sources
        sDout, sZ, sC = self._tiles(storage, index)
        ident_x = cute.make_identity_tensor((L, self.headdim))
        load_tile(g2s, thr, dout, ident_x, sDout, (TILE, P_TILE), (blk, ptile), L)
        if a.has_z != 0:
            load_tile(g2s, thr, z, ident_x, sZ, (TILE, P_TILE), (blk, ptile), L)
        load_tile(g2s, thr, C, cute.make_identity_tensor((L, self.d_state)), sC, (TILE, self.d_state), (blk, 0), L)

    def _tiles(self, storage, index):
        """dout, z and C of buffer ``index`` (0 or 1, a dynamic value)."""
        return (buffer(storage.dout, index, P_TILE), buffer(storage.z, index, P_TILE),
                buffer(storage.C, index, self.d_state))

    @cute.jit
    def _scan_block(self, a, raw, block_start, start, end, bias, A_log2, sCs, sChanges, lane):
        """A warp: the block's cumsum of Δ·A·log2(e) (Δ = 0 outside [start, end)) and the mask of rows where
        seq_idx differs from the row before (a sequence start inside [start, end)), from ``load_raw_block``."""
        dt0, dt1, here0, before0, here1, before1 = raw
        tok0 = block_start + lane
        tok1 = tok0 + 32
        d0 = Float32(0.0)
        d1 = Float32(0.0)
        if (tok0 >= start) & (tok0 < end):
            d0 = delta_from_dt(dt0.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
        if (tok1 >= start) & (tok1 < end):
            d1 = delta_from_dt(dt1.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
        c0, c1 = block_cumsum(d0, d1, A_log2, lane)
        sCs[lane] = c0
        sCs[lane + 32] = c1
        store_change_mask((here0, before0, here1, before1), sChanges, lane)

    @cute.jit
    def _gated_rows(self, a, sDout, sZ, sGe, sCs, base, s0, s1, tid, io_type: cutlass.Constexpr):
        """sGe[i] = 2^(cs_i - base) · dout_i ⊙ silu(z_i) for rows i in [s0, s1), zero elsewhere (row-wise vectors)."""
        per_row = self.threads // TILE
        s = tid // per_row
        part = tid % per_row
        factor = Float32(0.0)
        if (s >= s0) & (s < s1):
            factor = cute.math.exp2(cute.math.min(sCs[s] - base, Float32(0.0)), fastmath=True)
        chunks = P_TILE // CHUNK
        src = cute.zipped_divide(sDout[s, None], (CHUNK,))
        gate = cute.zipped_divide(sZ[s, None], (CHUNK,))
        dst = cute.zipped_divide(sGe[s, None], (CHUNK,))
        for k in cutlass.range_constexpr(chunks // per_row):
            chunk = part * (chunks // per_row) + k
            values = cute.make_rmem_tensor((CHUNK,), Float32)
            values.store(widen(src[None, chunk].load()) * factor)
            if a.has_z != 0:
                zs = cute.make_rmem_tensor((CHUNK,), Float32)
                zs.store(widen(gate[None, chunk].load()))
                for e in cutlass.range_constexpr(CHUNK):
                    values[e] = values[e] * silu(zs[e])
            dst[None, chunk].store(values.load().to(io_type))
