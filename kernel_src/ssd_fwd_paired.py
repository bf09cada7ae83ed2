"""ssd_fwd_paired: ssd_fwd's walk for two heads at once, warp-specialized (sm_90a; N 128, and N 64 in ssd_fwd_inline's).

The math, the parameters and the grid are ssd_fwd's (``kernel_src/ssd_fwd.py``): the runtime pairs the launches this
CTA can run (see ``runtime/mamba2_aot/plans/ssd_fwd.py``: no packed ``seq_idx``, no states-only pass, an even number of
heads per group, more than 66 pairs of heads: ``paired_pays``), and ssd_fwd runs the rest. Of the paired launches this
family runs those with z at N 128; ssd_fwd_inline's cubins (this class with an inline pass, its prefix empty) run the
others, 1-8 % faster: its loaders' order, and without z at N 128 rings of three. With z at N 128 this family's CTA is
the faster by 1.4-2.4 % (its writers take no part in TILES_FREE), so it is built at N 128 only (docs/PERF_NOTES.md,
forty-sixth session). On sm_90a a CTA is three warpgroups, one per SM, walking heads 2y and 2y + 1 of one group (grid
y; the CTAs past H / 2 exit at once):

- product warpgroups 0 and 1: the walk's products for one head each (C·Bᵀ, the weighted x, C·h₀ᵀ, the mask, S·x from
  registers, the h update), then y += D ⊙ x in fp32 from the x tile and y ·= silu(z) from the z tile (the same
  operations, in the same order, as ssd_fwd's row pass: the outputs are bitwise ssd_fwd's for finite inputs; without
  D the walk adds 0 · x and this kernel nothing), y staged in the I/O dtype (stmatrix). They keep their registers
  (``setmaxnreg``); everything else is the helper's. Their code is shorter than the walk's (``lean_mask``,
  ``overwrites_accumulators``): a CTA walks one sequence, so Δ is zero in a block's rows before it (the scan's) and
  the mask need not drop those columns; rows past the sequence are not stored, so the mask leaves them; the
  causal mask is an exponent of -inf, so a non-finite C·Bᵀ entry above the diagonal (a non-finite B, of this
  sequence or of another sharing the block, or an fp32 overflow) makes y non-finite at the earlier rows of its block
  (a non-finite x does so in both kernels); the first products overwrite fresh accumulators;
- the helper warpgroup: warps 0 and 1 (the loaders) scan Δ and the cumsums of the next block (warp w for head w)
  and cp.async B and C, which the two heads share; warps 2 and 3 (the writers) cp.async x and z and copy each
  head's staged y to ``out``.

Tiles sit in rings (slot k mod ring for block k, blocks counted from the walk's first): B, C, x and z are loaded two
blocks ahead at N 64 (rings of three; ssd_fwd_inline's variants) and one ahead at N 128 (two: three slots would not
fit), but in ssd_fwd_inline's N 128 variants without z (``z_gate`` False, which the runtime picks for calls without z), whose B, C and x have the z
slots' room for rings of three; Δ and the cumsums one block ahead in three slots. Hand-offs are named barriers
(``ssd_tiles.role_sync`` / ``role_arrive``):

- TR + k mod 3, per head: block k's tiles and scan are in shared memory (loaders and writers arrive, the head's
  products wait), but on rings of two its z after the walk's first block, which lands by the block's Y_FREE instead
  (``z_with_y_free``);
- Y_FREE, per head: the writers are done with the staged y and, on rings of two, the block's z has landed (the products
  wait before the gate, which reads z, and before staging the next y);
- Y_STAGED, per head: a block's y is staged (the products arrive, the writers wait);
- TILES_FREE + k mod 3, both heads: the products are done with block k's tiles (the loaders wait before loading into
  its slots; the writers learn it from Y_STAGED, and with an inline pass, whose blocks before the outputs stage no y
  and skip Y_FREE / Y_STAGED, from TILES_FREE too);
- WALK, per head: the head's product warpgroup alone.

A barrier's instance completes when its count of arrivals is reached, whoever arrives, so no side may arrive on one
barrier twice before the other side has passed the first instance: each barrier above is arrived on only after a wait
that proves it (the loaders publish block k + 1 after waiting for TILES_FREE of block k - 2, which the products
arrive on after taking TR of block k - 2: hence three TR barriers; the products may run two blocks ahead of the
loaders' TILES_FREE waits: hence three of those too; Y_FREE and Y_STAGED alternate by construction). With an inline
pass the writers wait on TILES_FREE too, as the loaders do (block k + 1 published after their wait for TILES_FREE of
block k - 1), and Y_FREE / Y_STAGED only in blocks with outputs, which alternate as before; the plan never sends a
walk without such a block (the writers' last Y_STAGED wait would never return).

On sm_100a, which has no wgmma, the cubin is ssd_fwd's walk, so that the runtime's choice between the two families
never depends on the device (N 256 is never paired: the plan keeps it on ssd_fwd, and no such variant is built).
``kernel_src/ssd_fwd_inline.py`` is this class with ``inline_pass`` on: a split call in one launch, its segments after
the first walking the state alone from their row's start (``_states_block``), and the paired launches but those with z
at N 128, with no such prefix.
"""

# (no "from __future__ import annotations": cute.struct reads its field annotations as live objects)
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype
from kernel_src.ssd_fwd import LOG2_E, P_TILE, SsdForward
from kernel_src.ssd_tiles import (CHUNK, SMEM_ALIGN, TILE, async_tile_copy, buffer, fence_operands, load_tile, make_mma,
                                  matrix_store, mn_view, role_arrive, role_sync, scan_slot, smem_layout, store_matrices,
                                  vec, vector, view, widen)
from kernel_src.ssm_math import silu_approx

WARPGROUP = 128
HEADS = 2                 # product warpgroups, one head each
LOADERS = WRITERS = 64    # the helper warpgroup's two roles
SCAN_SLOTS = 3            # Δ and cumsums, one block ahead of the products
# named barriers: per head w, 1 + PER_HEAD w + (TR + k mod BARRIER_SLOTS, Y_FREE, Y_STAGED, WALK); then TILES_FREE +
# k mod BARRIER_SLOTS. Three slots: a side may be two blocks ahead of the other's wait (module docstring).
BARRIER_SLOTS = 3
TR, Y_FREE, Y_STAGED, WALK = 0, BARRIER_SLOTS, BARRIER_SLOTS + 1, BARRIER_SLOTS + 2
PER_HEAD = WALK + 1
TILES_FREE = 1 + HEADS * PER_HEAD
TR_COUNT = WARPGROUP + LOADERS + WRITERS
Y_COUNT = WARPGROUP + WRITERS
TILES_FREE_COUNT = HEADS * WARPGROUP + LOADERS
# setmaxnreg: 2 product shares + the helper's = 3 x 168, the registers a 384-thread CTA gets per thread
REGISTERS_PER_THREAD = 168
PRODUCT_REGISTERS = {64: 184, 128: 216}   # by d_state (the products need ~172 at N 64); see product_registers


def head_barrier(w, which):
    """The id of head ``w``'s barrier ``which`` (TR, Y_FREE, Y_STAGED, WALK; TR + slot for the slots)."""
    return 1 + w * PER_HEAD + which


class SsdForwardPaired(SsdForward):
    family = "ssd_fwd_paired"
    # (N 64: ssd_fwd_inline's cubins run those launches; N 256 is never paired: the plan keeps it on ssd_fwd)
    d_states = (128,)
    # Whether the CTA gates y by z (z slots in shared memory). Always here: ssd_fwd_inline's variants without z set
    # it off, and run this family's launches without z (this family's own such cubin was not reproducible in the
    # forty-fifth session's builds; docs/PERF_NOTES.md, forty-fifth and forty-sixth sessions)
    z_gate = True

    @property
    def z_with_y_free(self) -> bool:
        """Whether the writers publish a block's z with Y_FREE instead of with its TR (but the walk's first block's,
        preloaded with TR): on rings of two (N 128 with z), where block k + 1's x and z are loaded while the products
        run block k. z is read only by the gate, after the products' Y_FREE wait, and by shared loads (no proxy fence
        needed), so its copies may land a block later: the writers commit x and z as two groups, publish TR once
        x's has landed (z's in flight, as :attr:`writers_two_ahead`'s publication leaves x's), and wait for z
        before they arrive on Y_FREE in the next block. 3.4-3.7 % off the z shapes on an H100, where TR waited for
        both (docs/PERF_NOTES.md, forty-fourth session)."""
        return self.ring == 2

    @property
    def writers_two_ahead(self) -> bool:
        """Whether the writers keep two blocks' x in flight: an inline pass's, on rings of three (N 64, and N 128
        without z: ``z_gate`` False). Each iteration issues block k + 2's x, then publishes block k + 1 once every
        copy but that newest one has landed. Publishing block k + 1 first would wait for every copy and leave one
        block's x in flight at a time: a block with outputs hides that load, but an inline pass's blocks of the state
        alone waited for it (ncu, thirty-seventh session), and B2 N64 took 5.8 % longer (docs/PERF_NOTES.md,
        thirty-eighth session)."""
        return self.inline_pass and self.ring == 3

    @property
    def product_registers(self):
        """Each product thread's setmaxnreg share: by d_state, but 224 without :attr:`z_gate` (ssd_fwd_inline at N 128,
        on rings of three), whose products spill 16 B at 216 (the helper's 56 then suffice)."""
        if not self.z_gate:
            return 224
        return PRODUCT_REGISTERS[self.d_state]

    @property
    def tiles_free_count(self):
        """TILES_FREE's participants: the products (arriving) and the loaders (waiting); with an inline pass the
        writers wait too, as they learn from it, not from Y_STAGED, when a block of the state alone is done with x."""
        return TILES_FREE_COUNT + (WRITERS if self.inline_pass else 0)

    @property
    def overwrites_accumulators(self):
        """The products' shorter code (ssd_fwd's switches) in the warp-specialized CTA; elsewhere the walk's."""
        return self._paired()

    lean_mask = overwrites_accumulators

    def _paired(self):
        """The warp-specialized CTA: sm_90a (wgmma) with N <= 128; else ssd_fwd's walk."""
        return self._warpgroup_mma()

    @property
    def threads(self):
        return 3 * WARPGROUP if self._paired() else super().threads

    @property
    def product_threads(self):
        """One product warpgroup per head."""
        return WARPGROUP if self._paired() else super().product_threads

    @property
    def min_ctas_per_sm(self):
        return 1 if self._paired() else super().min_ctas_per_sm

    @property
    def setmaxnreg_budget(self):
        """The registers per thread the launch must give (the warps' setmaxnreg shares averaged), or None."""
        return REGISTERS_PER_THREAD if self._paired() else None

    @property
    def dynamic_smem(self):
        if not self._paired():
            return super().dynamic_smem
        return self._paired_storage(cutlass_dtype(self.io_dtype)).size_in_bytes()

    @property
    def ring(self):
        """B, C, x and z slots per ring: loaded two blocks ahead where shared memory allows (N 64, or N 128 without
        :attr:`z_gate`, whose 32 KB of z slots then hold the third slots of B, C and x), else one. At N 128 without
        z, rings of three took 2.8 % off B2 L2048 H64 without z in ssd_fwd_inline on an H100 (docs/PERF_NOTES.md,
        forty-fifth session)."""
        return 3 if self.d_state == 64 or not self.z_gate else 2

    def _paired_storage(self, io_type):
        N, ring, tile, z_ring = self.d_state, self.ring, TILE * P_TILE, self.z_gate

        @cute.struct
        class SharedStorage:
            B: cute.struct.Align[cute.struct.MemRange[io_type, ring * TILE * N], SMEM_ALIGN]
            C: cute.struct.Align[cute.struct.MemRange[io_type, ring * TILE * N], SMEM_ALIGN]
            x: cute.struct.Align[cute.struct.MemRange[io_type, HEADS * ring * tile], SMEM_ALIGN]   # [head][slot]
            if z_ring:
                z: cute.struct.Align[cute.struct.MemRange[io_type, HEADS * ring * tile], SMEM_ALIGN]
            weighted_x: cute.struct.Align[cute.struct.MemRange[io_type, HEADS * tile], SMEM_ALIGN]
            y: cute.struct.Align[cute.struct.MemRange[io_type, HEADS * tile], SMEM_ALIGN]          # the outputs
            h: cute.struct.Align[cute.struct.MemRange[io_type, HEADS * P_TILE * N], SMEM_ALIGN]
            D: cute.struct.Align[cute.struct.MemRange[Float32, HEADS * P_TILE], SMEM_ALIGN]
            delta: cute.struct.Align[cute.struct.MemRange[Float32, HEADS * SCAN_SLOTS * TILE], SMEM_ALIGN]
            cs: cute.struct.Align[cute.struct.MemRange[Float32, HEADS * SCAN_SLOTS * TILE], SMEM_ALIGN]

        return SharedStorage

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        if cutlass.const_expr(not self._paired()):
            self.walk(a, cute.arch.block_idx(), cutlass.utils.SmemAllocator().allocate(self.dynamic_smem, SMEM_ALIGN))
        else:
            storage = self._paired_storage(cutlass_dtype(self.io_dtype))(
                cutlass.utils.SmemAllocator().allocate(self.dynamic_smem, SMEM_ALIGN))
            ptile, pair, source = cute.arch.block_idx()
            # a split call's rows are in x, after the slices of P; its segments in z (segment-major), as in ssd_fwd
            ptiles = self.headdim // P_TILE
            split_row = ptile // ptiles
            ptile = ptile % ptiles
            segment = source % a.segments
            source = source // a.segments + split_row
            if pair * HEADS < a.nheads:
                role = cute.arch.warp_idx() // 4
                if role < HEADS:
                    cute.arch.warpgroup_reg_alloc(self.product_registers)
                    self._products_walk(a, storage, ptile, pair * HEADS + role, role, source, segment)
                else:
                    cute.arch.warpgroup_reg_dealloc(3 * REGISTERS_PER_THREAD - HEADS * self.product_registers)
                    tid = cute.arch.thread_idx()[0] - HEADS * WARPGROUP
                    if tid < LOADERS:
                        self._loader(a, storage, pair * HEADS, source, segment, tid)
                    else:
                        self._writer(a, storage, ptile, pair * HEADS, source, segment, tid - LOADERS)

    # ---- shared-memory views

    def _scan_slot(self, storage_range, w, k):
        """Head w's Δ (or cumsums) slot of block k (counted from the walk's first)."""
        return scan_slot(storage_range.get_tensor(cute.make_layout((TILE,))), w * SCAN_SLOTS + k % SCAN_SLOTS)

    def _ring_tile(self, storage_range, w, k):
        """Head w's x (or z) tile of block k."""
        return buffer(storage_range, w * self.ring + k % self.ring, P_TILE)

    def _sD(self, storage):
        return cute.make_tensor(storage.D.data_ptr(), cute.make_layout((HEADS, P_TILE), stride=(P_TILE, 1)))

    # ---- the product warpgroups

    @cute.jit
    def _products_walk(self, a, storage, ptile, h, w, source, segment):
        """Product warpgroup w: head h's walk over the CTA's blocks, its state in the accumulators."""
        N = self.d_state
        io_type, state_type = cutlass_dtype(self.io_dtype), cutlass_dtype(self.state_dtype)
        tid = cute.arch.thread_idx()[0] % WARPGROUP
        p0 = ptile * P_TILE
        states = self._state_views(a)  # (no block states: _block_states_view is ssd_fwd's)
        row, first, start, end = self._walk_tokens(a, source, segment)
        blk_first, blk_end = self._blocks(first, end)
        seq = source  # (no seq_idx here: the sequence is the row, or cu_seqlens' sequence)
        sH = cute.make_tensor(storage.h.data_ptr() + cute.assume(w * (P_TILE * N), divby=P_TILE * N),
                              smem_layout((P_TILE, N)))
        mma = make_mma(io_type, tid, self.warps, warpgroups=1)
        acc_h = cute.make_rmem_tensor(mma.thr.partition_shape_C((P_TILE, N)), Float32)
        staging = (matrix_store(mma, buffer(storage.y, w, P_TILE), io_type), matrix_store(mma, sH, io_type))  # y, h₀
        walk_barrier = head_barrier(w, WALK)
        if self._from_row_start(a, segment):
            self._begin_sequence(a, states, mma, acc_h, sH, seq, h, p0, io_type)
        else:  # the chunk state before start, as the states-only pass or the segment before this one left it
            if a.has_segment_flags != 0:  # (ssd_fwd's _await_flag on the warpgroup's barrier)
                if tid == 0:
                    ready = Int32(0)
                    while ready == 0:
                        ready = cute.arch.load(self._segment_flag(a, ptile, h, row, segment - 1), Int32,
                                               sem="acquire", scope="gpu")
                role_sync(walk_barrier, WARPGROUP)
            self._set_state(mma, acc_h, sH, states.chunks[row, start // a.chunk_size - 1, h, None, None], True, p0,
                            io_type)
        fence_operands(mma)
        # as in ssd_fwd: a states-only pass wrote the chunk states of every segment but the last; a handover's
        # segments write theirs but the last
        stores_chunks = (a.has_chunk_states != 0) & ((segment == a.segments - 1) != (a.has_segment_flags != 0))
        blk_out = blk_first
        if cutlass.const_expr(self.inline_pass):
            # (an inline split's segment_len is a multiple of 64, so is its start; elsewhere first is start, no prefix)
            blk_out = cute.math.min(start // TILE, blk_end)
            for blk in range(blk_first, blk_out):
                self._states_block(storage, mma, acc_h, staging, w, walk_barrier, blk, blk - blk_first, first, end,
                                   tid, io_type)
        for blk in range(blk_out, blk_end):
            self._products_block(a, states, storage, mma, acc_h, sH, staging, w, walk_barrier, row, h, p0, blk,
                                 blk - blk_first, start, end, stores_chunks, tid, io_type)
        if segment == a.segments - 1:
            self._end_sequence(a, states, mma, acc_h, seq, h, p0, state_type)
        if (a.has_segment_flags != 0) & (segment < a.segments - 1):  # (ssd_fwd's _set_flag on the warpgroup's barrier)
            cute.arch.fence_acq_rel_gpu()
            role_sync(walk_barrier, WARPGROUP)
            if tid == 0:
                cute.arch.store(self._segment_flag(a, ptile, h, row, segment), Int32(1), sem="release", scope="gpu")

    @cute.jit
    def _products_block(self, a, states, storage, mma, acc_h, sH, staging, w, walk_barrier, row, h, p0, blk, k, start,
                        end, stores_chunks, tid, io_type: cutlass.Constexpr):
        """Block blk (the walk's k-th): the products once its tiles are published, y finished and staged, h₀ of the
        next block staged."""
        sB, sC, sX, sDelta, sCs, sXw, block_start, s0, s1 = self._block_tiles(storage, w, blk, k, start, end)
        # ssd_fwd's products on the warpgroup-MMA path (no S tile, y returned in registers), on the warpgroup's barrier
        acc_y = self._products((mma, acc_h, sX, sB, sC, None, sXw, None, sH, sDelta, sCs), s0, s1, tid, io_type,
                               walk_barrier)
        if stores_chunks:
            self._store_chunk_state(a, states, mma, acc_h, row, h, p0, block_start + s1 - 1, a.seqlen)
        # (the writers have written sD before their first arrival, and the block's z before each: z_with_y_free)
        role_sync(head_barrier(w, Y_FREE), Y_COUNT)
        if a.has_D != 0:
            self._add_skip(mma, acc_y, sX, self._sD(storage), w)
        if cutlass.const_expr(self.z_gate):
            if a.has_z != 0:
                self._gate(mma, acc_y, self._ring_tile(storage.z, w, k))
        store_matrices(staging[0], acc_y, io_type)
        store_matrices(staging[1], acc_h, io_type)
        fence_operands(mma)  # (h₀ for the next block's C·h₀ᵀ)
        role_arrive(head_barrier(w, Y_STAGED), Y_COUNT)
        role_arrive(TILES_FREE + k % BARRIER_SLOTS, self.tiles_free_count)

    @cute.jit
    def _block_tiles(self, storage, w, blk, k, start, end):
        """Block blk's (the walk's k-th) views for head w's products, once the block is published (its TR barrier,
        waited for here): (B, C, x, Δ, cumsums, weighted x, the block's first token, and its
        rows [s0, s1) in [start, end))."""
        sB, sC = self._BC_slots(storage, k)
        sX = self._ring_tile(storage.x, w, k)
        sDelta = self._scan_slot(storage.delta, w, k)
        sCs = self._scan_slot(storage.cs, w, k)
        sXw = buffer(storage.weighted_x, w, P_TILE)
        self._await_published(w, k)
        block_start = blk * TILE
        s0 = cute.math.max(start, block_start) - block_start
        s1 = cute.math.min(end, block_start + TILE) - block_start
        return sB, sC, sX, sDelta, sCs, sXw, block_start, s0, s1

    def _BC_slots(self, storage, k):
        """The B and C ring slots of the walk's k-th block (the two heads share them)."""
        return buffer(storage.B, k % self.ring, self.d_state), buffer(storage.C, k % self.ring, self.d_state)

    def _await_published(self, w, k):
        """Head w's products wait for the walk's k-th block to be published (its TR barrier; once per block)."""
        role_sync(head_barrier(w, TR) + k % BARRIER_SLOTS, TR_COUNT)

    @cute.jit
    def _states_block(self, storage, mma, acc_h, staging, w, walk_barrier, blk, k, first, end, tid,
                      io_type: cutlass.Constexpr):
        """Block blk (the walk's k-th) of an inline pass: h advanced past its rows in [first, end) with ssd_fwd's
        operations in ssd_fwd_pass's order (the state is bitwise the pass's, so the outputs after it are the unsplit
        call's), and staged as the next block's h₀; no y, so neither Y_FREE nor Y_STAGED (the writers skip them
        too). (Staging h only after the last such block, the one whose h₀ a product reads, was within noise on the
        H200: docs/PERF_NOTES.md, thirty-ninth session.)"""
        sB, _, sX, sDelta, sCs, sXw, _, s0, s1 = self._block_tiles(storage, w, blk, k, first, end)
        base, cs_end = self._run_cumsums(sCs, s0, s1)
        self._weigh_rows(sX, sXw, sDelta, sCs, s0, s1, cs_end, tid, io_type)
        fence_operands(mma)
        self._walk_sync(walk_barrier)  # the weighted x is complete
        self._advance_state(mma, acc_h, sXw, sB, base, cs_end)
        self._walk_sync(walk_barrier)  # every warp done reading the weighted x
        store_matrices(staging[1], acc_h, io_type)
        fence_operands(mma)  # (h₀ for the next block's C·h₀ᵀ)
        role_arrive(TILES_FREE + k % BARRIER_SLOTS, self.tiles_free_count)

    @cute.jit
    def _add_skip(self, mma, acc_y, sX, sD, w):
        """y += D ⊙ x over the accumulator (one FFMA per element, as ssd_fwd's row pass), x from its tile."""
        Y = mn_view(acc_y)
        X = mn_view(mma.thr.partition_C(sX))
        columns = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, P_TILE))))
        for n in cutlass.range_constexpr(cute.size(Y, mode=[1]) // 2):
            d = cute.zipped_divide(sD[w, None], (2,))[None, columns[0, (0, n)][1] // 2].load()  # a column pair's D
            for r in cutlass.range_constexpr(cute.size(Y, mode=[0])):
                xv = widen(X[r, (None, n)].load())
                Y[r, (0, n)] = Y[r, (0, n)] + d[0] * xv[0]
                Y[r, (1, n)] = Y[r, (1, n)] + d[1] * xv[1]

    @cute.jit
    def _gate(self, mma, acc_y, sZ):
        """y ·= silu(z) over the accumulator, z from its tile."""
        Y = mn_view(acc_y)
        Z = mn_view(mma.thr.partition_C(sZ))
        for n in cutlass.range_constexpr(cute.size(Y, mode=[1]) // 2):
            for r in cutlass.range_constexpr(cute.size(Y, mode=[0])):
                zv = widen(Z[r, (None, n)].load())
                Y[r, (0, n)] = Y[r, (0, n)] * silu_approx(zv[0])
                Y[r, (1, n)] = Y[r, (1, n)] * silu_approx(zv[1])

    # ---- the loaders (helper warps 0 and 1)

    @cute.jit
    def _loader(self, a, storage, h0, source, segment, t):
        """Loader thread t: warp w scans head h0 + w's Δ; both warps cp.async B and C."""
        N = self.d_state
        io_type = cutlass_dtype(self.io_dtype)
        L, H = a.seqlen, a.nheads
        warp = t // 32
        lane = cute.arch.lane_idx()
        row, first, start, end = self._walk_tokens(a, source, segment)
        blk_first, blk_end = self._blocks(first, end)
        g = h0 // a.heads_per_group
        G = H // a.heads_per_group
        Bm = view(a.B, (a.batch, L, G, N), vec(a.stride_B_batch), vec(a.stride_B_seqlen), vec(a.stride_B_group), 1)
        Cm = view(a.C, (a.batch, L, G, N), vec(a.stride_C_batch), vec(a.stride_C_seqlen), vec(a.stride_C_group), 1)
        dt = view(a.dt, (a.batch, L, H), a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)
        sources = (Bm[row, None, g, None], Cm[row, None, g, None], async_tile_copy(io_type, LOADERS),
                   cute.make_identity_tensor((L, N)), start)
        h = h0 + warp
        A_log2 = view(a.A, (H,), a.stride_A_head)[h] * Float32(LOG2_E)
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = view(a.dt_bias, (H,), a.stride_dt_bias_head)[h]
        scan = (a, storage, dt, row, h, first, end, bias, A_log2, warp, lane)
        ahead = self.ring - 1
        for i in cutlass.range_constexpr(ahead):
            self._load_BC(storage, sources, blk_first + i, blk_end, i, t, L)
        dt0, dt1 = self._raw_dt(dt, row, h, blk_first, lane, L)
        self._scan_into(scan, dt0, dt1, blk_first, 0)
        dt0, dt1 = self._raw_dt(dt, row, h, blk_first + 1, lane, L)
        if blk_first < blk_end:
            self._publish(ahead - 1, 0)
        for blk in range(blk_first, blk_end):
            dt0, dt1 = self._loader_block(scan, sources, blk, blk - blk_first, blk_end, dt0, dt1, t, L)
        if blk_first < blk_end:
            role_sync(TILES_FREE + (blk_end - 1 - blk_first) % BARRIER_SLOTS, self.tiles_free_count)

    @cute.jit
    def _loader_block(self, scan, sources, blk, k, blk_end, dt0, dt1, t, L):
        """While the products run block blk: block blk + 1's scan and tiles published, then the loads of block
        blk + ring - 1 into the slots of block blk - 1 once the products are done with it. Returns the raw dt of
        block blk + 2."""
        _, storage, dt, row, h, _, _, _, _, _, lane = scan
        ahead = self.ring - 1
        if cutlass.const_expr(self.inline_pass):
            # the loads first, the scan while they land: an inline pass's blocks are short, and the walk's order
            # (scan, then loads, then their wait) put both on each of them
            self._load_freed_BC(storage, sources, blk, k, blk_end, t, L)
            self._scan_into(scan, dt0, dt1, blk + 1, k + 1)
            dt0, dt1 = self._raw_dt(dt, row, h, blk + 2, lane, L)
            if blk + 1 < blk_end:
                self._publish(ahead - 1, k + 1)
        else:
            self._scan_into(scan, dt0, dt1, blk + 1, k + 1)
            dt0, dt1 = self._raw_dt(dt, row, h, blk + 2, lane, L)
            if cutlass.const_expr(ahead == 2):
                if blk + 1 < blk_end:
                    self._publish(0, k + 1)
            self._load_freed_BC(storage, sources, blk, k, blk_end, t, L)
            if cutlass.const_expr(ahead == 1):
                if blk + 1 < blk_end:
                    self._publish(0, k + 1)
        return dt0, dt1

    @cute.jit
    def _load_freed_BC(self, storage, sources, blk, k, blk_end, t, L):
        """Once the products are done with block blk - 1 (TILES_FREE), block blk + ring - 1's B and C into its slots."""
        if k > 0:
            role_sync(TILES_FREE + (k - 1) % BARRIER_SLOTS, self.tiles_free_count)
        self._load_BC(storage, sources, blk + self.ring - 1, blk_end, k + self.ring - 1, t, L)

    @cute.jit
    def _scan_into(self, scan, dt0, dt1, blk, k):
        """Block blk's Δ and cumsums (the walk's k-th) into this warp's head's scan slot."""
        a, storage, _, _, _, start, end, bias, A_log2, warp, lane = scan
        self._scan_block(a, dt0, dt1, blk, start, end, bias, A_log2, self._scan_slot(storage.delta, warp, k),
                         self._scan_slot(storage.cs, warp, k), lane)

    @cute.jit
    def _load_BC(self, storage, sources, blk, blk_end, k, t, L):
        """cp.async block blk's B and C (no C for an inline pass's blocks, before the outputs' start) into ring slot k
        mod ring; one commit group (empty past blk_end)."""
        N = self.d_state
        gB, gC, g2s, ident, start = sources
        thr = g2s.get_slice(t)
        if blk < blk_end:
            load_tile(g2s, thr, gB, ident, buffer(storage.B, k % self.ring, N), (TILE, N), (blk, 0), L)
            with_C = True
            if cutlass.const_expr(self.inline_pass):
                with_C = blk * TILE + TILE > start
            if with_C:
                load_tile(g2s, thr, gC, ident, buffer(storage.C, k % self.ring, N), (TILE, N), (blk, 0), L)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _publish(self, pending: cutlass.Constexpr, k):
        """This thread's copies but the newest ``pending`` commit groups landed: arrive on both heads' TR of block k."""
        cute.arch.cp_async_wait_group(pending)
        cute.arch.fence_proxy("async.shared", space="cta")
        for w in cutlass.range_constexpr(HEADS):
            role_arrive(head_barrier(w, TR) + k % BARRIER_SLOTS, TR_COUNT)

    @cute.jit
    def _raw_dt(self, dt, row, h, blk, lane, L):
        """A warp: block blk's raw dt of head h, rows lane and lane + 32 (zeros past L). ssd_fwd's ``_load_raw`` without
        seq_idx: built on this, the walk's cubins change (its loads' order), so the walk keeps its own."""
        dt0 = dt.element_type(0.0)
        dt1 = dt.element_type(0.0)
        tok = blk * TILE + lane
        if tok < L:
            dt0 = dt[row, tok, h]
        if tok + 32 < L:
            dt1 = dt[row, tok + 32, h]
        return dt0, dt1

    # ---- the writers (helper warps 2 and 3)

    @cute.jit
    def _writer(self, a, storage, ptile, h0, source, segment, t):
        """Writer thread t: D of both heads into shared memory, then per block the x and z loads ring - 1 blocks
        ahead (into the slots of a block the products are done with) and the previous block's outputs."""
        P = self.headdim
        io_type = cutlass_dtype(self.io_dtype)
        L, H = a.seqlen, a.nheads
        row, first, start, end = self._walk_tokens(a, source, segment)
        blk_first, blk_end = self._blocks(first, end)
        x = view(a.x, (a.batch, L, H, P), vec(a.stride_x_batch), vec(a.stride_x_seqlen), vec(a.stride_x_head), 1)
        z = view(a.z, (a.batch, L, H, P), vec(a.stride_z_batch), vec(a.stride_z_seqlen), vec(a.stride_z_head), 1)
        out = view(a.out, (a.batch, L, H, P), vec(a.stride_out_batch), vec(a.stride_out_seqlen),
                   vec(a.stride_out_head), 1)
        sources = (x[row, None, h0, None], x[row, None, h0 + 1, None], z[row, None, h0, None],
                   z[row, None, h0 + 1, None], async_tile_copy(io_type, WRITERS), cute.make_identity_tensor((L, P)),
                   start)
        outputs = (a, storage, out, row, h0, ptile, start, end, t)  # (an inline pass's blocks store nothing: < start)
        ahead = self.ring - 1
        for i in cutlass.range_constexpr(ahead):
            self._load_xz(a, storage, sources, ptile, blk_first + i, blk_end, i, t, L)
        D = view(a.D, (H, P), a.stride_D_head, a.stride_D_dim)
        sD = self._sD(storage)
        for w in cutlass.range_constexpr(HEADS):
            d_value = Float32(0.0)
            if a.has_D != 0:
                d_value = D[h0 + w, ptile * P_TILE + t]
            sD[w, t] = d_value
        if blk_first < blk_end:
            self._publish(ahead - 1, 0)
        for blk in range(blk_first, blk_end):
            self._writer_block(outputs, sources, blk, blk - blk_first, blk_end, L)
        if blk_first < blk_end:
            for w in cutlass.range_constexpr(HEADS):
                role_sync(head_barrier(w, Y_STAGED), Y_COUNT)
                self._store_outputs(outputs, w, blk_end - 1)
            if cutlass.const_expr(self.inline_pass):  # (the writers take part in TILES_FREE: its last instance too)
                role_sync(TILES_FREE + (blk_end - 1 - blk_first) % BARRIER_SLOTS, self.tiles_free_count)

    @cute.jit
    def _writer_block(self, outputs, sources, blk, k, blk_end, L):
        """While the products run block blk: block blk + 1's x and z published (loaded two ahead), block blk - 1's
        outputs, then the loads of block blk + ring - 1 into block blk - 1's slots (published here, one ahead; its x
        alone with :attr:`z_with_y_free`). With :attr:`writers_two_ahead`: the loads, then the publication, then the
        outputs."""
        a, storage, _, _, _, ptile, _, _, t = outputs
        ahead = self.ring - 1
        if cutlass.const_expr(self.writers_two_ahead):
            # no output store is in flight at the publication's proxy fence, whose MEMBAR would wait for it
            self._await_tiles_free(k)
            self._load_xz(a, storage, sources, ptile, blk + ahead, blk_end, k + ahead, t, L)
            if blk + 1 < blk_end:
                self._publish(1, k + 1)
            self._hand_over_outputs(outputs, blk, k)
        else:
            if cutlass.const_expr(ahead == 2):
                if blk + 1 < blk_end:
                    self._publish(0, k + 1)
            self._hand_over_outputs(outputs, blk, k)
            if cutlass.const_expr(self.inline_pass):
                self._await_tiles_free(k)
            self._load_xz(a, storage, sources, ptile, blk + ahead, blk_end, k + ahead, t, L)
            if cutlass.const_expr(ahead == 1):
                if blk + 1 < blk_end:
                    self._publish(1 if self.z_with_y_free else 0, k + 1)  # (z's group may still be in flight)

    @cute.jit
    def _hand_over_outputs(self, outputs, blk, k):
        """Block blk - 1's staged y of both heads to ``out`` once staged, and the staging buffers handed to block
        blk. Every block stages a y but an inline pass's blocks before start, which have no Y_STAGED, Y_FREE or
        outputs (the writers learn from TILES_FREE when their x and z slots are free)."""
        _, _, _, _, _, _, start, _, _ = outputs
        if cutlass.const_expr(self.z_with_y_free):
            cute.arch.cp_async_wait_group(0)  # (block blk's z, loaded one block ago, before Y_FREE publishes it)
        staged_before = k > 0
        stages = True
        if cutlass.const_expr(self.inline_pass):
            staged_before = (k > 0) & (blk * TILE > start)
            stages = blk * TILE + TILE > start
        for w in cutlass.range_constexpr(HEADS):
            if staged_before:
                role_sync(head_barrier(w, Y_STAGED), Y_COUNT)
                self._store_outputs(outputs, w, blk - 1)
            if stages:
                role_arrive(head_barrier(w, Y_FREE), Y_COUNT)

    @cute.jit
    def _await_tiles_free(self, k):
        """An inline pass's writers: the products are done with block k - 1's x and z slots (from the second block)."""
        if k > 0:
            role_sync(TILES_FREE + (k - 1) % BARRIER_SLOTS, self.tiles_free_count)

    @cute.jit
    def _load_xz(self, a, storage, sources, ptile, blk, blk_end, k, t, L):
        """cp.async block blk's x (and z, with :attr:`z_gate`) of both heads into ring slot k mod ring; one commit group
        (two with :attr:`z_with_y_free`, x's then z's, but past blk_end)."""
        gx0, gx1, gz0, gz1, g2s, ident, start = sources
        thr = g2s.get_slice(t)
        if blk < blk_end:
            for w in cutlass.range_constexpr(HEADS):
                load_tile(g2s, thr, gx0 if w == 0 else gx1, ident, self._ring_tile(storage.x, w, k), (TILE, P_TILE),
                          (blk, ptile), L)
            if cutlass.const_expr(self.z_with_y_free):
                cute.arch.cp_async_commit_group()  # (x's group: the block's TR waits for it alone)
            if cutlass.const_expr(self.z_gate):
                gated = a.has_z != 0
                if cutlass.const_expr(self.inline_pass):  # (no z for an inline pass's blocks)
                    gated = gated & (blk * TILE + TILE > start)
                if gated:
                    for w in cutlass.range_constexpr(HEADS):
                        load_tile(g2s, thr, gz0 if w == 0 else gz1, ident, self._ring_tile(storage.z, w, k),
                                  (TILE, P_TILE), (blk, ptile), L)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _store_outputs(self, outputs, w, blk):
        """Head h0 + w's staged y of block blk to ``out``, its rows in [start, end): writer t takes the 16-byte runs
        t mod 8 of rows t / 8 + 8 i."""
        _, storage, out, row, h0, ptile, start, end, t = outputs
        sY = buffer(storage.y, w, P_TILE)
        rows = out[row, None, h0 + w, None]
        runs = P_TILE // CHUNK
        step = WRITERS // runs
        block_start = blk * TILE
        s0 = cute.math.max(start, block_start) - block_start
        s1 = cute.math.min(end, block_start + TILE) - block_start
        r0 = t // runs
        run = t % runs
        # this thread's rows as one view: the row pointer steps by `step` rows instead of being recomputed per row
        row_step = step * rows.layout.stride[0]
        mine = cute.make_tensor(rows[block_start + r0, None].iterator,
                                cute.make_layout((TILE // step, self.headdim), stride=(row_step, 1)))
        whole = (s0 == 0) & (s1 == TILE)
        staged = []
        for i in cutlass.range_constexpr(TILE // step):
            staged.append(vector(sY[r0 + step * i, None], run).load())
        for i in cutlass.range_constexpr(TILE // step):
            s = r0 + step * i
            if whole | ((s >= s0) & (s < s1)):
                vector(mine[i, None], ptile * runs + run).store(staged[i])
