"""ssd_chunk_cumsum: Δ preprocessing and the per-chunk cumulative sum of Δ·A (first stage of the SSD forward).

Math (BRIEF §2; the layout of state-spaces/mamba's ``_chunk_cumsum_fwd``)::

    Δ[b,l,h]  = clamp(softplus?(dt[b,l,h] + dt_bias[h]), dt_min, dt_max)      softplus(v) = v if v > 20
    dt_out[b,h,c,t]    = Δ[b, c·Q + t, h]                          (0 past the end of the sequence)
    dA_cumsum[b,h,c,t] = Σ_{s ≤ t} Δ[b, c·Q + s, h] · A[h]        (flat past the end of the sequence)

One warp per (chunk, batch row, head), HEADS_PER_CTA heads per CTA. The warp walks the chunk 32 positions
at a time: a shuffle scan of each row of 32 plus the carry of the rows before it. No shared memory. At chunk size
LOADS_FIRST_CHUNK the warp loads all its rows' dt first (at a position clamped into the sequence; Δ = 0 past its
end): a row's load under its bound check, behind the stores before it (which might alias dt), waits its whole
latency in turn, once per row (eight rows at 256). Measured on the H200 (docs/PERF_NOTES.md, ssd_chunk_cumsum): 8-43 %
less time at chunk size 256 at the three reference (batch, L, H); 2-9 % more at 64 (B8 L4096 H80, B1 L8192 H128) and
at 128 (B1 L8192 H128, the Nemotron-H shape), so those keep the row-by-row loads. The same source on every arch.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from kernel_src.abi import bind, f32, i32, ptr, strides
from kernel_src.families import expect_constants
from kernel_src.ssm_math import delta_from_dt, warp_inclusive_scan

WARP = 32
HEADS_PER_CTA = 4
LOADS_FIRST_CHUNK = 256  # the chunk size whose warps load every row's dt before the first store (module docstring)


class ChunkCumsum:
    family = "ssd_chunk_cumsum"
    grid_rule = "chunks,batch,heads/4"
    chunk_sizes = (64, 128, 256)
    dt_dtypes = ("bf16", "fp16", "fp32")

    def __init__(self, chunk_size: int, dt_dtype: str):
        expect_constants(self, chunk_size=chunk_size, dt_dtype=dt_dtype)
        self.chunk_size = chunk_size
        self.dt_dtype = dt_dtype
        self.block = (HEADS_PER_CTA * WARP, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = 0

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
        c, b, head_block = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        h = head_block * HEADS_PER_CTA + cute.arch.warp_idx()

        # Int64 strides make every offset 64-bit: wide strided views (dt sliced from a fused projection).
        mdt = cute.make_tensor(a.dt, cute.make_layout((a.batch, a.seqlen, a.nheads), stride=(
            a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)))
        mA = cute.make_tensor(a.A, cute.make_layout((a.nheads,), stride=(a.stride_A_head,)))
        mbias = cute.make_tensor(a.dt_bias, cute.make_layout((a.nheads,), stride=(a.stride_dt_bias_head,)))
        out_shape = (a.batch, a.nheads, a.nchunks, self.chunk_size)
        mdt_out = cute.make_tensor(a.dt_out, cute.make_layout(out_shape, stride=(
            a.stride_dt_out_batch, a.stride_dt_out_head, a.stride_dt_out_chunk, a.stride_dt_out_pos)))
        mdA = cute.make_tensor(a.dA_cumsum, cute.make_layout(out_shape, stride=(
            a.stride_dA_cumsum_batch, a.stride_dA_cumsum_head, a.stride_dA_cumsum_chunk, a.stride_dA_cumsum_pos)))

        if h < a.nheads:  # uniform per warp: the shuffles below stay converged
            A_h = mA[h]
            bias = Float32(0.0)
            if a.has_dt_bias != 0:
                bias = mbias[h]
            rows = self.chunk_size // WARP
            loads_first = self.chunk_size == LOADS_FIRST_CHUNK
            raw = []
            if cutlass.const_expr(loads_first):
                last = a.seqlen - 1
                raw = [mdt[b, cute.math.min(c * self.chunk_size + row * WARP + lane, last), h] for row in range(rows)]
            carry = Float32(0.0)
            for row in cutlass.range_constexpr(rows):
                t = row * WARP + lane
                pos = c * self.chunk_size + t
                delta = Float32(0.0)
                if cutlass.const_expr(loads_first):
                    delta = Float32(cutlass.select_(pos < a.seqlen, delta_from_dt(
                        raw[row].to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max), Float32(0.0)))
                elif pos < a.seqlen:
                    delta = delta_from_dt(mdt[b, pos, h].to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
                # Past the end of the sequence Δ is exactly 0, so the cumsum stays flat (no 0·inf from A).
                running = warp_inclusive_scan(delta * A_h, lane) + carry
                carry = cute.arch.shuffle_sync(running, WARP - 1)
                mdt_out[b, h, c, t] = delta
                mdA[b, h, c, t] = running
