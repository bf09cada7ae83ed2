"""ssd_fwd_pass: a split ssd_fwd call's states-only pass (on sm_90a, two warpgroups and a ring of tiles).

A call with few CTAs for the GPU is split along L (``kernel_src/ssd_fwd.py``, ``runtime/mamba2_aot/plans/ssd_fwd.py``):
this pass first walks the state recurrence alone over its first segments, h ← 2^(cs_end − base)·h + (weighted x)ᵀ·B
per 64-token block (ssd_fwd's math: ``_weigh_rows``, ``_advance_state``), and stores the states entering the later
segments as chunk states; then ssd_fwd, ssd_fwd_paired or ssd_fwd_inline runs every segment at once. The pass is one CTA per (64-row
slice of P, head, row): 128 of them at the B2 L2048 H64 and Nemotron-H-like shapes, one per SM, each a chain of blocks
that waited on its tiles (loaded one block ahead in ssd_fwd's walk, ~1 µs a block). Here x and B sit in a ring of four
slots, loaded three blocks ahead; a block's product with h runs while the next block's x is weighed (no branch between
the product and its wait, so ptxas keeps the wgmma asynchronous); on sm_90a two warpgroups share the work along N.
The same operations in the same order as ssd_fwd's pass: the states are bitwise its. On the warp-MMA CTA (off sm_90a,
and N 256) the CTA is ssd_fwd's.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.ssd_fwd import P_TILE, SsdForward
from kernel_src.ssd_tiles import TILE, buffer, fence_operands, scan_slot, smem_layout


class SsdForwardPass(SsdForward):
    family = "ssd_fwd_pass"
    states_pass = True
    segment_handover = False  # (the pass is one launch before the segments)
    gate_buffers = 0          # no outputs: no z

    @property
    def ring(self):
        """x and B tiles in flight: a block's loads are issued ring - 1 blocks before its weighing. Four (measured
        against two and seven, docs/PERF_NOTES.md, twenty-ninth session); two at N 256, where four do not fit, and on
        sm_120a (99 KB per CTA)."""
        assert self.target_arch is not None, "ssd_fwd_pass's ring follows the target: set target_arch first"
        return 2 if self.d_state > 128 or self.target_arch == "sm_120a" else 4

    @property
    def x_tiles(self):
        return self.ring

    b_tiles = x_tiles

    @property
    def mma_warpgroups(self):
        """Two warpgroups side by side along N on the wgmma CTA."""
        return 2 * super().mma_warpgroups

    @property
    def warps(self):
        """(rows, columns) of warps: two warpgroups' worth with wgmma (the warp-MMA CTA is ssd_fwd's)."""
        return (2, 4) if self._warpgroup_mma() else super().warps

    def _extra_params(self):
        """None: a pass hands no state over (ssd_fwd's handover parameters are the segments' launch's)."""
        return []

    @property
    def min_ctas_per_sm(self):
        """One: the pass's CTAs are few (a split call's rows), and the registers are the warps'."""
        return 1

    def _scratch_floats(self):
        """Two weighted x (a block's product reads one while the next block is weighed into the other)."""
        return 2 * TILE * P_TILE * 2 // 4

    def _tiles(self, storage, k, io_type):
        """Block k's (counted from the walk's first) x and B ring slots and weighted x buffer."""
        xw = cute.recast_ptr(storage.scratch.data_ptr(), dtype=io_type)
        return (buffer(storage.x, k % self.ring, P_TILE), buffer(storage.B, k % self.ring, self.d_state),
                cute.make_tensor(xw + cute.assume(k % 2 * (TILE * P_TILE), divby=TILE * P_TILE),
                                 smem_layout((TILE, P_TILE))))

    @cute.jit
    def _walk_states(self, walk, loads, storage, blk_first, blk_end, dt0, dt1, io_type: cutlass.Constexpr):
        """h over blocks [blk_first, blk_end) with no outputs, the chunk states stored. Block k's product with h
        runs while block k + 1's x is weighed; the tiles sit in a ring, loaded ``ring`` - 1 blocks ahead. A block's
        cumsum does not depend on the blocks before it, so the first ``scan_group`` warps scan a group of blocks
        at once, one each. ``dt0``, ``dt1``: warp 0's raw dt of the first block. Sequence changes are not looked at:
        the runtime sends no packed call here."""
        (a, _, mma, _, _, _, _, _, dt, seq_idx, row, h, _, _, _, _, _, _, warp_id, lane) = walk
        tid = loads[1]
        if (warp_id > 0) & (warp_id < self.scan_group):  # (warp 0 has the first block's: dt0, dt1)
            dt0, dt1, _, _ = self._load_raw(a, dt, seq_idx, row, h, blk_first + warp_id, lane, a.seqlen)
        dt0, dt1 = self._scan_group(walk, blk_first, dt0, dt1)
        for k in cutlass.range_constexpr(self.ring - 1):
            self._load_ring(loads, storage, blk_first, blk_end, k, io_type)
        cute.arch.cp_async_wait_group(self.ring - 2)
        cute.arch.sync_threads()  # the first block's tiles and its group's scans
        weighed = self._weigh_block(walk, blk_first, Int32(0), self._tiles(storage, 0, io_type), tid, io_type)
        fence_operands(mma)
        cute.arch.sync_threads()  # the first block's weighted x
        blk = blk_first
        while blk < blk_end:
            weighed, dt0, dt1 = self._pass_block(walk, loads, storage, blk, blk_first, weighed, dt0, dt1, io_type)
            blk = blk + 1

    @cute.jit
    def _pass_block(self, walk, loads, storage, blk, blk_first, weighed, dt0, dt1, io_type: cutlass.Constexpr):
        """Block blk of :meth:`_walk_states`, its x weighed (``weighed``: its cumsums before and at its rows): the
        loads ``ring`` - 1 blocks ahead, its product with h while the next block's x is weighed, its chunk state, the
        next scan group. Returns the next block's ``weighed`` and the scanning warps' raw dt."""
        (a, states, mma, acc_h, _, _, _, _, _, _, row, h, p0, _, end, blk_end, _, _, _, _) = walk
        tid, L = loads[1], loads[7]
        k = blk - blk_first
        # (into the slot of block k - 1, whose product every warp waited for before the barrier that ended it)
        self._load_ring(loads, storage, blk_first, blk_end, k + self.ring - 1, io_type)
        here = self._tiles(storage, k, io_type)
        base, cs_end = weighed
        self._advance_state(mma, acc_h, here[2], here[1], base, cs_end, wait=False)
        # no branch until the product's wait: ptxas serializes a warpgroup MMA that a branch separates from its wait
        cute.arch.cp_async_wait_group(self.ring - 2)
        cute.arch.sync_threads()  # block k + 1's tiles (and its group's scans) are in
        weighed = self._weigh_block(walk, blk + 1, (k + 1) % self.scan_group, self._tiles(storage, k + 1, io_type), tid,
                                    io_type)
        mma.wait()
        self._store_chunk_state(a, states, mma, acc_h, row, h, p0, cute.math.min(end, blk * TILE + TILE) - 1, L)
        fence_operands(mma)
        cute.arch.sync_threads()  # the next weighted x; every warp done with block k's tiles and the scan slots
        if (k + 2) % self.scan_group == 0:
            dt0, dt1 = self._scan_group(walk, blk + 2, dt0, dt1)
        return weighed, dt0, dt1

    @cute.jit
    def _load_ring(self, loads, storage, blk_first, blk_end, k, io_type: cutlass.Constexpr):
        """cp.async block blk_first + k's x and B into its ring slot (nothing past the walk); one commit group, empty
        past the walk (the ring's wait counts one per block)."""
        sX, sB, _ = self._tiles(storage, k, io_type)
        if blk_first + k < blk_end:
            self._load_states_tiles(loads, (sX, sB), blk_first + k, commit=False)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _scan_group(self, walk, blk, dt0, dt1):
        """Warp w < ``scan_group``: Δ and the cumsums of block blk + w into scan slot w (read after the next barrier,
        which no warp passes before every block of the group before has read its slot), then the raw dt of block
        blk + scan_group + w. Returns those raw dt."""
        (a, _, _, _, _, sDelta, sCs, _, dt, seq_idx, row, h, _, start, end, _, bias, A_log2, warp_id, lane) = walk
        if warp_id < self.scan_group:
            self._scan_block(a, dt0, dt1, blk + warp_id, start, end, bias, A_log2, scan_slot(sDelta, warp_id),
                             scan_slot(sCs, warp_id), lane)
            dt0, dt1, _, _ = self._load_raw(a, dt, seq_idx, row, h, blk + self.scan_group + warp_id, lane, a.seqlen)
        return dt0, dt1

    @cute.jit
    def _weigh_block(self, walk, blk, slot, tiles, tid, io_type: cutlass.Constexpr):
        """Block blk's weighted x into ``tiles``' buffer from its x and scan ``slot``, without a branch (a block past
        the walk weighs its rows by 0: its buffer may then hold NaN from stale x, which no product reads); returns its
        (base, cs_end)."""
        (_, _, _, _, _, sDelta, sCs, _, _, _, _, _, _, start, end, _, _, _, _, _) = walk
        block_start = blk * TILE
        s0 = cute.math.max(start, block_start) - block_start
        s1 = cute.math.min(end, block_start + TILE) - block_start
        slot_delta = scan_slot(sDelta, slot)
        slot_cs = scan_slot(sCs, slot)
        base = Float32(cutlass.select_(s0 > 0, slot_cs[cute.math.max(s0 - 1, 0)], Float32(0.0)))
        cs_end = slot_cs[cute.math.max(s1 - 1, 0)]
        self._weigh_rows(tiles[0], tiles[2], slot_delta, slot_cs, s0, s1, cs_end, tid, io_type)
        return base, cs_end
