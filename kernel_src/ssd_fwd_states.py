"""ssd_fwd_states: the SSD forward's states-only walk writing the state after every 64-token block, for ssd_bwd.

ssd_bwd recomputes the forward's state after every 64-token block (``block_states``, in the I/O dtype: the
backward's products take h₀ so). This kernel is ssd_fwd (math and code: kernel_src/ssd_fwd.py) with that walk in place
of the walk with outputs, so ssd_fwd's own cubins stay as they are. The walk follows packed sequences: a block is
walked in runs split at its sequence starts (seq_idx), each run starting from its sequence's initial state; with
cu_seqlens each CTA walks one sequence, and a block's state is written by the CTA whose sequence reaches the
block's end. Each state is staged in shared memory in the I/O dtype and written in 16-byte rows.
"""
# (no "from __future__ import annotations": the DSL reads annotations as live objects)
import cutlass
import cutlass.cute as cute

from kernel_src.abi import ptr, i32, strides
from kernel_src.ssd_fwd import P_TILE, SsdForward
from kernel_src.ssd_tiles import (CHUNK, SCAN_GROUP, TILE, VECTOR, fence_operands, load_raw_block, mask_bit, mn_view,
                                  next_change, scan_slot, store_change_mask, store_pairs, vec, vector, view)


class SsdForwardStates(SsdForward):
    family = "ssd_fwd_states"
    block_states_walk = True
    segment_handover = False  # its calls are never split (and ssd_bwd_walks puts a second walk in its grid)
    change_slots = SCAN_GROUP  # a scan group's sequence-change masks
    # no outputs: no z's tiles, and of the scratch only the weighted x (76160 B of dynamic shared memory at N = 128,
    # 102784 with ssd_fwd's layout; measured faster at 2.7B, 381 → 312 µs): three CTAs per SM fit at N = 128 (with the
    # 1024 B the driver reserves per CTA, 3 × 77184 of an SM's 233472 B) in at most 168 registers; ncu's launch
    # statistics confirm three (its limits by registers and by shared memory)
    gate_buffers = 0
    weighted_x_offset = 0

    def _scratch_floats(self):
        """The weighted x only (this walk has no S and no y)."""
        return TILE * P_TILE * 2 // 4

    @property
    def min_ctas_per_sm(self):
        return 3 if self._warpgroup_mma() else 1

    @property
    def scan_group(self):
        """Four blocks at once on every CTA shape (this walk holds no operand fragments of the products)."""
        return SCAN_GROUP

    def _extra_params(self):
        """ssd_fwd's parameters (its ``states_only`` is 1 here: a states-only walk, as ssd_fwd_pass), then the block
        states."""
        return [ptr("block_states", self.io_dtype, align=2 * VECTOR),
                *strides("block_states", "batch", "block", "head"), i32("has_block_states")]

    def _block_states_view(self, a):
        P, N = self.headdim, self.d_state
        return view(a.block_states, (a.batch, (a.seqlen + TILE - 1) // TILE, a.nheads, P, N),
                    vec(a.stride_block_states_batch), vec(a.stride_block_states_block),
                    vec(a.stride_block_states_head), N, 1)

    @cute.jit
    def _walk_block_states(self, walk, loads, blk_first, blk_end, first, second, seq, io_type: cutlass.Constexpr):
        """h over blocks [blk_first, blk_end), the state after each block to block_states. Two blocks per iteration,
        x and B double-buffered (``first``, ``second``), so each block's loads overlap the previous block's work.
        A block's cumsum does not depend on the blocks before it, so the first SCAN_GROUP warps scan a group of
        blocks at once, one each (Δ, cumsums and sequence changes), and a block's chain holds no scan. ``seq``
        numbers the sequence the walk starts in."""
        (a, states, _, _, _, _, _, _, sH, dt, seq_idx, row, h, p0, start, end, _, _, _, warp_id, lane) = walk
        tid = loads[1]
        # (as ssd_bwd_dstates: every warp loads the raw values of its block of the first group; warps from
        # SCAN_GROUP on, in an 8-warp CTA, never use theirs)
        dt0, dt1, here0, before0, here1, before1 = load_raw_block(a, dt, seq_idx, row, h, (blk_first + warp_id) * TILE,
                                                                  start, end, lane)
        blk = blk_first
        if blk_end > blk_first:  # (an empty sequence walks nothing: no copy may be left in flight)
            self._load_states_tiles(loads, first, blk)
        while blk < blk_end:
            if (blk - blk_first) % SCAN_GROUP == 0:  # (SCAN_GROUP is even: a group starts an iteration)
                dt0, dt1, here0, before0, here1, before1 = self._scan_group_runs(
                    walk, blk, (dt0, dt1, here0, before0, here1, before1))
            seq = self._block_states_block(walk, loads, blk, (blk - blk_first) % SCAN_GROUP, first, second, seq,
                                           io_type)
            if blk + 1 < blk_end:
                seq = self._block_states_block(walk, loads, blk + 1, (blk + 1 - blk_first) % SCAN_GROUP, second,
                                               first, seq, io_type)
            blk = blk + 2
        if blk_end > blk_first:
            cute.arch.sync_threads()  # the last block's state in sH
            last = blk_end - 1
            self._store_block_state(a, states, sH, row, h, p0, last, end - last * TILE, tid)

    @cute.jit
    def _scan_group_runs(self, walk, blk, raw):
        """Warp w < SCAN_GROUP: Δ, the cumsums and the sequence changes of block blk + w into scan slot w (published
        by the barrier of block blk, which no warp passes before every block of the group before has read its slot)
        from its ``raw`` values (``load_raw_block``'s), then the raw values of block blk + SCAN_GROUP + w. Returns
        those."""
        (a, _, _, _, _, sDelta, sCs, sChanges, _, dt, seq_idx, row, h, _, start, end, _, bias, A_log2, warp_id,
         lane) = walk
        dt0, dt1, here0, before0, here1, before1 = raw
        if warp_id < SCAN_GROUP:
            block = blk + warp_id
            self._scan_block(a, dt0, dt1, block, start, end, bias, A_log2, scan_slot(sDelta, warp_id),
                             scan_slot(sCs, warp_id), lane)
            store_change_mask((here0, before0, here1, before1), scan_slot(sChanges, warp_id), lane)
            dt0, dt1, here0, before0, here1, before1 = load_raw_block(
                a, dt, seq_idx, row, h, (block + SCAN_GROUP) * TILE, start, end, lane)
        return dt0, dt1, here0, before0, here1, before1

    @cute.jit
    def _block_states_block(self, walk, loads, blk, slot, here, there, seq, io_type: cutlass.Constexpr):
        """One block of :meth:`_walk_block_states` from the tiles in ``here`` and the scan ``slot``, the next block's
        loads into ``there``: its runs (split at sequence starts), each weighing its rows of x and advancing h past
        them; the state after the block staged in sH. Returns the number of the sequence the block ends in."""
        (a, states, mma, acc_h, sXw, sDelta, sCs, sChanges, sH, _, _, row, h, p0, start, end, blk_end, _, _, _,
         _) = walk
        tid = loads[1]
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # this block's tiles (and a group's scans) are in; every warp done with the last block
        if blk + 1 < blk_end:
            self._load_states_tiles(loads, there, blk + 1)
        block_start = blk * TILE
        slot_delta = scan_slot(sDelta, slot)
        slot_cs = scan_slot(sCs, slot)
        slot_changes = scan_slot(sChanges, slot)
        changes_lo = slot_changes[0]
        changes_hi = slot_changes[1]
        first_row = cute.math.max(start, block_start) - block_start
        seg = first_row
        seg_stop = cute.math.min(end, block_start + TILE) - block_start
        while seg < seg_stop:
            seg_end = cute.math.min(next_change(changes_lo, changes_hi, seg), seg_stop)
            if seg > first_row:
                cute.arch.sync_threads()  # every warp done with the last run's weighted x
            if mask_bit(changes_lo, changes_hi, seg) != 0:  # a sequence starts at this run: h from its initial state
                seq = seq + 1
                self._begin_sequence(a, states, mma, acc_h, sH, seq, h, p0, io_type, staged=False)
            base, cs_end = self._run_cumsums(slot_cs, seg, seg_end)
            self._weigh_rows(here[0], sXw, slot_delta, slot_cs, seg, seg_end, cs_end, tid, io_type)
            fence_operands(mma)  # (and the block's tiles)
            if (seg == first_row) & (block_start > start):
                # the last block's state, left in sH (rewritten after this barrier), stored after the proxy fence,
                # whose MEMBAR would wait for these stores to land
                self._store_block_state(a, states, sH, row, h, p0, blk - 1, TILE, tid)
            cute.arch.sync_threads()  # the weighted x
            self._advance_state(mma, acc_h, sXw, here[1], base, cs_end)
            seg = seg_end
        self._stage_state(mma, acc_h, sH, io_type)
        return seq

    @cute.jit
    def _stage_state(self, mma, acc_h, sH, io_type: cutlass.Constexpr):
        """h into sH in the I/O dtype."""
        store_pairs(mn_view(acc_h), mn_view(mma.thr.partition_C(sH)), io_type)

    @cute.jit
    def _store_block_state(self, a, states, sH, row, h, p0, blk, rows_walked, tid):
        """The state after block blk (staged in sH) to block_states[row, blk] when the walk took the block to its
        end (``rows_walked`` of its rows: to its 64th, or to L), 16 bytes per store."""
        block_start = blk * TILE
        if block_start + rows_walked == cute.math.min(block_start + TILE, a.seqlen):
            dst = cute.local_tile(states.blocks[row, blk, h, None, None], (P_TILE, self.d_state), (p0 // P_TILE, 0))
            runs = self.d_state // CHUNK
            for k in cutlass.range_constexpr(P_TILE * runs // self.threads):
                item = tid + k * self.threads
                p = item // runs
                vector(dst[p, None], item % runs).store(vector(sH[p, None], item % runs).load())
