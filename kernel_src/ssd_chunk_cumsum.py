"""ssd_chunk_cumsum: Δ preprocessing and the per-chunk cumulative sum of Δ·A (first stage of the SSD forward).

Math (BRIEF §2; the layout of state-spaces/mamba's ``_chunk_cumsum_fwd``)::

    Δ[b,l,h]  = clamp(softplus?(dt[b,l,h] + dt_bias[h]), dt_min, dt_max)      softplus(v) = v if v > 20
    dt_out[b,h,c,t]    = Δ[b, c·Q + t, h]                          (0 past the end of the sequence)
    dA_cumsum[b,h,c,t] = Σ_{s ≤ t} Δ[b, c·Q + s, h] · A[h]        (flat past the end of the sequence)

One CTA per (chunk, batch row, head) with one thread per chunk position: a warp-shuffle inclusive scan,
then the warp totals are added through shared memory.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass import Float32, Int32, Int64

from kernel_src.abi import f32, i32, i64, ptr

WARP = 32


class ChunkCumsum:
    family = "ssd_chunk_cumsum"
    grid_rule = "chunks,batch,heads"
    chunk_sizes = (64, 128, 256)
    dt_dtypes = ("bf16", "fp16", "fp32")

    def __init__(self, chunk_size: int, dt_dtype: str):
        if chunk_size not in self.chunk_sizes:
            raise ValueError(f"chunk_size {chunk_size} not in {self.chunk_sizes}")
        if dt_dtype not in self.dt_dtypes:
            raise ValueError(f"dt_dtype {dt_dtype!r} not in {self.dt_dtypes}")
        self.chunk_size = chunk_size
        self.dt_dtype = dt_dtype
        self.num_warps = chunk_size // WARP
        self.block = (chunk_size, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = self.num_warps * 4  # one fp32 total per warp

    def params(self):
        """The flat parameter list, in kernel order (see kernel_src/abi.py)."""
        return [
            ptr("dt", self.dt_dtype), ptr("A", "fp32"), ptr("dt_bias", "fp32"),
            ptr("dt_out", "fp32"), ptr("dA_cumsum", "fp32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("nchunks"),
            i64("stride_dt_batch"), i64("stride_dt_seqlen"), i64("stride_dt_head"),
            i64("stride_A_head"), i64("stride_dt_bias_head"),
            i64("stride_dt_out_batch"), i64("stride_dt_out_head"), i64("stride_dt_out_chunk"), i64("stride_dt_out_pos"),
            i64("stride_dA_cumsum_batch"), i64("stride_dA_cumsum_head"), i64("stride_dA_cumsum_chunk"),
            i64("stride_dA_cumsum_pos"),
            i32("has_dt_bias"), i32("dt_softplus"), f32("dt_min"), f32("dt_max"),
        ]

    @cute.jit
    def __call__(
        self,
        dt: cute.Pointer, A: cute.Pointer, dt_bias: cute.Pointer, dt_out: cute.Pointer, dA_cumsum: cute.Pointer,
        batch: Int32, seqlen: Int32, nheads: Int32, nchunks: Int32,
        stride_dt_batch: Int64, stride_dt_seqlen: Int64, stride_dt_head: Int64,
        stride_A_head: Int64, stride_dt_bias_head: Int64,
        stride_dt_out_batch: Int64, stride_dt_out_head: Int64, stride_dt_out_chunk: Int64, stride_dt_out_pos: Int64,
        stride_dA_cumsum_batch: Int64, stride_dA_cumsum_head: Int64, stride_dA_cumsum_chunk: Int64,
        stride_dA_cumsum_pos: Int64,
        has_dt_bias: Int32, dt_softplus: Int32, dt_min: Float32, dt_max: Float32,
        stream,
    ):
        self.kernel(
            dt, A, dt_bias, dt_out, dA_cumsum, batch, seqlen, nheads, nchunks,
            stride_dt_batch, stride_dt_seqlen, stride_dt_head, stride_A_head, stride_dt_bias_head,
            stride_dt_out_batch, stride_dt_out_head, stride_dt_out_chunk, stride_dt_out_pos,
            stride_dA_cumsum_batch, stride_dA_cumsum_head, stride_dA_cumsum_chunk, stride_dA_cumsum_pos,
            has_dt_bias, dt_softplus, dt_min, dt_max,
        ).launch(grid=[nchunks, batch, nheads], block=list(self.block), smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(
        self,
        dt: cute.Pointer, A: cute.Pointer, dt_bias: cute.Pointer, dt_out: cute.Pointer, dA_cumsum: cute.Pointer,
        batch: Int32, seqlen: Int32, nheads: Int32, nchunks: Int32,
        stride_dt_batch: Int64, stride_dt_seqlen: Int64, stride_dt_head: Int64,
        stride_A_head: Int64, stride_dt_bias_head: Int64,
        stride_dt_out_batch: Int64, stride_dt_out_head: Int64, stride_dt_out_chunk: Int64, stride_dt_out_pos: Int64,
        stride_dA_cumsum_batch: Int64, stride_dA_cumsum_head: Int64, stride_dA_cumsum_chunk: Int64,
        stride_dA_cumsum_pos: Int64,
        has_dt_bias: Int32, dt_softplus: Int32, dt_min: Float32, dt_max: Float32,
    ):
        Q = self.chunk_size
        t, _, _ = cute.arch.thread_idx()
        c, b, h = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()

        # Int64 strides make every offset 64-bit: wide strided views (dt sliced from a fused projection).
        mdt = cute.make_tensor(dt, cute.make_layout((batch, seqlen, nheads),
                                                    stride=(stride_dt_batch, stride_dt_seqlen, stride_dt_head)))
        mA = cute.make_tensor(A, cute.make_layout((nheads,), stride=(stride_A_head,)))
        out_shape = (batch, nheads, nchunks, Q)
        mdt_out = cute.make_tensor(dt_out, cute.make_layout(
            out_shape, stride=(stride_dt_out_batch, stride_dt_out_head, stride_dt_out_chunk, stride_dt_out_pos)))
        mdA = cute.make_tensor(dA_cumsum, cute.make_layout(
            out_shape, stride=(stride_dA_cumsum_batch, stride_dA_cumsum_head, stride_dA_cumsum_chunk,
                               stride_dA_cumsum_pos)))

        pos = c * Q + t
        delta = Float32(0.0)
        if pos < seqlen:
            delta = mdt[b, pos, h].to(Float32)
            if has_dt_bias != 0:
                mbias = cute.make_tensor(dt_bias, cute.make_layout((nheads,), stride=(stride_dt_bias_head,)))
                delta = delta + mbias[h]
            if dt_softplus != 0:
                if delta <= Float32(20.0):
                    delta = cute.math.log1p(cute.math.exp(delta))
            delta = cute.math.min(cute.math.max(delta, dt_min), dt_max)
        # Past the end of the sequence Δ is exactly 0, so the cumsum stays flat (no 0·inf from A).
        running = delta * mA[h]

        for k in cutlass.range_constexpr(5):
            offset = 1 << k
            neighbour = cute.arch.shuffle_sync_up(running, offset)
            if lane >= offset:
                running = running + neighbour

        smem = cutlass.utils.SmemAllocator()
        warp_totals = smem.allocate_tensor(Float32, cute.make_layout((self.num_warps,)), byte_alignment=4)
        if lane == WARP - 1:
            warp_totals[warp] = running
        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(self.num_warps - 1):
            if w < warp:
                running = running + warp_totals[w]

        mdt_out[b, h, c, t] = delta
        mdA[b, h, c, t] = running
