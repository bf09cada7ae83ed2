"""ssd_bwd_reduce: the backward's fixed-order sums of partial results (the last kernel of ``ssd_bwd``).

Per head (the first ``nheads`` CTAs): dD[h, p] = Σ_tokens G·x, dA[h] = Σ_tokens Δ·da and ddt_bias[h] = Σ_tokens
ddt (BRIEF §2; the terms are defined in kernel_src/ssd_bwd_chunk.py) arrive as one partial sum per (row, 64-token
block, head) in ``partials`` (batch, nblocks, H, P + 2): columns 0..P-1 dD, P dA, P + 1 ddt_bias. Thread j adds
column j over (row, block) in order; dD of shape (H,) sums its P columns in order too.

Per group (the CTAs after those, only when ``head_splits`` > 1): ssd_bwd_chunk split each group's heads over
``head_splits`` CTAs, which left their shares of dB and dC in ``group_grads`` (2, head_splits, batch, L, G, N),
fp32; each thread adds one element's shares in split order and writes dB / dC in the I/O dtype.

No atomics anywhere: the sums are bitwise reproducible.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, i32, ptr, strides
from kernel_src.families import expect_constants
from kernel_src.ssd_tiles import view

THREADS = 256
GROUP_SUM_PER_THREAD = 4   # dB / dC elements a thread of a group-sum CTA finishes


class SsdBackwardReduce:
    family = "ssd_bwd_reduce"
    grid_rule = "heads+group_sum_ctas"
    headdims = (64, 128)
    io_dtypes = ("bf16", "fp16")
    group_sum_elements = THREADS * GROUP_SUM_PER_THREAD   # per CTA after the heads' (the plan sizes the grid by it)

    def __init__(self, headdim: int, io_dtype: str):
        expect_constants(self, headdim=headdim, io_dtype=io_dtype)
        self.headdim, self.io_dtype = headdim, io_dtype
        self.block = (THREADS, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = 4 * headdim   # the column sums (fp32)

    def params(self):
        io = self.io_dtype
        return [
            ptr("partials", "fp32"), ptr("dD", "fp32"), ptr("dA", "fp32"), ptr("ddt_bias", "fp32"),
            ptr("group_grads", "fp32"), ptr("dB", io), ptr("dC", io),
            i32("batch"), i32("seqlen"), i32("nblocks"), i32("nheads"), i32("ngroups"), i32("d_state"),
            i32("head_splits"), i32("group_sum_ctas"),
            *strides("partials", "batch", "block", "head"), *strides("dD", "head", "dim"), *strides("dA", "head"),
            *strides("ddt_bias", "head"),
            *strides("group_grads", "grad", "split", "batch", "seqlen", "group"),
            *strides("dB", "batch", "seqlen", "group"), *strides("dC", "batch", "seqlen", "group"),
            i32("has_dD"), i32("dD_per_head"), i32("has_ddt_bias"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[a.nheads + a.group_sum_ctas, 1, 1], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        cta, _, _ = cute.arch.block_idx()
        j, _, _ = cute.arch.thread_idx()
        if cta < a.nheads:
            self._head_sums(a, cta, j)
        else:
            self._group_sums(a, cta - a.nheads, j)

    @cute.jit
    def _head_sums(self, a, h, j):
        P = self.headdim
        partials = view(a.partials, (a.batch, a.nblocks, a.nheads, P + 2), a.stride_partials_batch,
                        a.stride_partials_block, a.stride_partials_head, 1)
        dD = view(a.dD, (a.nheads, P), a.stride_dD_head, a.stride_dD_dim)
        dA = view(a.dA, (a.nheads,), a.stride_dA_head)
        ddt_bias = view(a.ddt_bias, (a.nheads,), a.stride_ddt_bias_head)
        smem = cutlass.utils.SmemAllocator()
        column_sums = smem.allocate_tensor(Float32, cute.make_layout((P,)), 16)

        total = Float32(0.0)
        if j < P + 2:
            for b in range(a.batch):
                for blk in range(a.nblocks):
                    total = total + partials[b, blk, h, j]
        if j == P:
            dA[h] = total
        if j == P + 1:
            if a.has_ddt_bias != 0:
                ddt_bias[h] = total
        if j < P:
            column_sums[j] = total
            if a.has_dD != 0:
                if a.dD_per_head == 0:
                    dD[h, j] = total
        cute.arch.sync_threads()
        if j == 0:
            if a.has_dD != 0:
                if a.dD_per_head != 0:
                    per_head = Float32(0.0)
                    for p in range(Int32(P)):
                        per_head = per_head + column_sums[p]
                    dD[h, 0] = per_head

    @cute.jit
    def _group_sums(self, a, cta, j):
        io_type = cutlass_dtype(self.io_dtype)
        L, G, N = a.seqlen, a.ngroups, a.d_state
        shares = view(a.group_grads, (2, a.head_splits, a.batch, L, G, N), a.stride_group_grads_grad,
                      a.stride_group_grads_split, a.stride_group_grads_batch, a.stride_group_grads_seqlen,
                      a.stride_group_grads_group, 1)
        dB = view(a.dB, (a.batch, L, G, N), a.stride_dB_batch, a.stride_dB_seqlen, a.stride_dB_group, 1)
        dC = view(a.dC, (a.batch, L, G, N), a.stride_dC_batch, a.stride_dC_seqlen, a.stride_dC_group, 1)
        count = a.batch * L * G * N
        for k in cutlass.range_constexpr(GROUP_SUM_PER_THREAD):
            e = (cta * GROUP_SUM_PER_THREAD + k) * THREADS + j
            if e < count:
                n = e % N
                g = (e // N) % G
                t = (e // (N * G)) % L
                b = e // (N * G * L)
                db = Float32(0.0)
                dc = Float32(0.0)
                for split in range(a.head_splits):
                    db = db + shares[0, split, b, t, g, n]
                    dc = dc + shares[1, split, b, t, g, n]
                dB[b, t, g, n] = db.to(io_type)
                dC[b, t, g, n] = dc.to(io_type)
