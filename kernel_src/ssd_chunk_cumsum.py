"""ssd_chunk_cumsum: Δ preprocessing and the per-chunk cumulative sum of Δ·A (first stage of the SSD forward).

Math (BRIEF §2; the layout of state-spaces/mamba's ``_chunk_cumsum_fwd``)::

    Δ[b,l,h]  = clamp(softplus?(dt[b,l,h] + dt_bias[h]), dt_min, dt_max)      softplus(v) = v if v > 20
    dt_out[b,h,c,t]    = Δ[b, c·Q + t, h]                          (0 past the end of the sequence)
    dA_cumsum[b,h,c,t] = Σ_{s ≤ t} Δ[b, c·Q + s, h] · A[h]        (flat past the end of the sequence)

One CTA per (chunk, batch row, HEADS_PER_CTA heads), in two phases split by one barrier:

- the load: dt is (batch, L, heads) with the heads innermost, so the CTA reads its chunk as a (Q × 16 heads) tile,
  each warp two rows of 16 heads, a 32-byte sector of bf16 / fp16 per row. Every thread's loads, at positions clamped
  into the sequence, come before the barrier and every global store (ptxas issues half or more of them before Δ's
  math and the rest among it, where each waits for the load it uses); it computes Δ (0 past the end) into a shared
  (heads × Q) tile, transposed;
- the scan: each warp takes two heads and scans the tile's rows along Q, 32 positions at a time, all rows' shuffle
  scans side by side, then the carries (the running sum of the rows' totals, in row order), and writes both outputs
  along Q (128 contiguous bytes per warp and row where they are contiguous along Q).

Shuffle scan and carries are added in the order of one warp walking the chunk 32 positions at a time. Still slower
than Triton's ``_chunk_cumsum_fwd`` (0.8x at the reference shapes on an H100, docs/PERF_NOTES.md): its softplus is
the approximate log(exp(v) + 1), ours ssm_math's, shared by every family.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from kernel_src.abi import bind, f32, i32, ptr, strides
from kernel_src.families import expect_constants
from kernel_src.ssm_math import delta_from_dt, warp_inclusive_scans

WARP = 32
WARPS = 8
THREADS = WARPS * WARP
HEADS_PER_CTA = 16  # a tile row of 16 heads: one 32-byte sector of bf16 / fp16 dt
ROWS_PER_PASS = THREADS // HEADS_PER_CTA  # the tile rows the CTA loads per load instruction
# The shared tile's rows (one per head) padded by two words: a warp's stores (two positions × 16 heads) then fall in
# 32 different banks; the scan's loads are 32 consecutive words of one row.
ROW_PAD = 2


class ChunkCumsum:
    family = "ssd_chunk_cumsum"
    grid_rule = "chunks,batch,heads/16"
    chunk_sizes = (64, 128, 256)
    dt_dtypes = ("bf16", "fp16", "fp32")

    def __init__(self, chunk_size: int, dt_dtype: str):
        expect_constants(self, chunk_size=chunk_size, dt_dtype=dt_dtype)
        self.chunk_size = chunk_size
        self.dt_dtype = dt_dtype
        self.block = (THREADS, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = HEADS_PER_CTA * (chunk_size + ROW_PAD) * 4

    def params(self):
        """The flat parameter list, in kernel order (see kernel_src/abi.py)."""
        return [
            ptr("dt", self.dt_dtype), ptr("A", "fp32"), ptr("dt_bias", "fp32"),
            ptr("dt_out", "fp32"), ptr("dA_cumsum", "fp32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("nchunks"),
            *strides("dt", "batch", "seqlen", "head"), *strides("A", "head"), *strides("dt_bias", "head"),
            *strides("dt_out", "batch", "head", "chunk", "pos"), *strides("dA_cumsum", "batch", "head", "chunk", "pos"),
            i32("has_dt_bias"), i32("dt_softplus"), f32("dt_min"), f32("dt_max"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[a.nchunks, a.batch, (a.nheads + HEADS_PER_CTA - 1) // HEADS_PER_CTA],
                                 block=list(self.block), smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        Q = self.chunk_size
        c, b, head_block = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        first_head = head_block * HEADS_PER_CTA

        # Int64 strides make every offset 64-bit: wide strided views (dt sliced from a fused projection).
        mdt = cute.make_tensor(a.dt, cute.make_layout((a.batch, a.seqlen, a.nheads), stride=(
            a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)))
        mA = cute.make_tensor(a.A, cute.make_layout((a.nheads,), stride=(a.stride_A_head,)))
        mbias = cute.make_tensor(a.dt_bias, cute.make_layout((a.nheads,), stride=(a.stride_dt_bias_head,)))
        out_shape = (a.batch, a.nheads, a.nchunks, Q)
        mdt_out = cute.make_tensor(a.dt_out, cute.make_layout(out_shape, stride=(
            a.stride_dt_out_batch, a.stride_dt_out_head, a.stride_dt_out_chunk, a.stride_dt_out_pos)))
        mdA = cute.make_tensor(a.dA_cumsum, cute.make_layout(out_shape, stride=(
            a.stride_dA_cumsum_batch, a.stride_dA_cumsum_head, a.stride_dA_cumsum_chunk, a.stride_dA_cumsum_pos)))
        smem = cutlass.utils.SmemAllocator()
        tile = smem.allocate_tensor(Float32, cute.make_layout((HEADS_PER_CTA, Q), stride=(Q + ROW_PAD, 1)), 16)

        # The load. Heads past nheads (the last tile of an nheads not a multiple of 16) read their last head's
        # values, which no warp writes out.
        column = tid % HEADS_PER_CTA
        h = cute.math.min(first_head + column, a.nheads - 1)
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = mbias[h]
        first_row = tid // HEADS_PER_CTA
        last = a.seqlen - 1
        raw = [mdt[b, cute.math.min(c * Q + first_row + k * ROWS_PER_PASS, last), h]
               for k in range(Q // ROWS_PER_PASS)]
        for k in cutlass.range_constexpr(Q // ROWS_PER_PASS):
            t = first_row + k * ROWS_PER_PASS
            # Past the end of the sequence Δ is exactly 0, so the cumsum stays flat (no 0·inf from A).
            tile[column, t] = Float32(cutlass.select_(c * Q + t < a.seqlen, delta_from_dt(
                raw[k].to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max), Float32(0.0)))
        cute.arch.sync_threads()

        # The scan: warp w takes the tile's heads w and w + WARPS.
        warp = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        rows = Q // WARP
        columns = [warp + i * WARPS for i in range(HEADS_PER_CTA // WARPS)]
        heads = [first_head + col for col in columns]
        A_h = [mA[cute.math.min(head, a.nheads - 1)] for head in heads]
        deltas = [tile[col, row * WARP + lane] for col in columns for row in range(rows)]
        scans = warp_inclusive_scans([d * A_h[i // rows] for i, d in enumerate(deltas)], lane)
        totals = [cute.arch.shuffle_sync(s, WARP - 1) for s in scans]
        for i in cutlass.range_constexpr(len(heads)):
            head = heads[i]
            if head < a.nheads:  # uniform per warp
                carry = Float32(0.0)
                for row in cutlass.range_constexpr(rows):
                    t = row * WARP + lane
                    mdt_out[b, head, c, t] = deltas[i * rows + row]
                    mdA[b, head, c, t] = scans[i * rows + row] + carry
                    carry = carry + totals[i * rows + row]
