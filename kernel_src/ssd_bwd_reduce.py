"""ssd_bwd_reduce: the backward's per-head sums over tokens (the last kernel of ``ssd_bwd``).

dD[h, p] = Σ_tokens G·x, dA[h] = Σ_tokens Δ·da and ddt_bias[h] = Σ_tokens ddt (BRIEF §2; the terms are defined in
kernel_src/ssd_bwd_chunk.py) arrive as one partial sum per (row, 64-token block, head) in ``partials``
(batch, nblocks, H, P + 2): columns 0..P-1 dD, P dA, P + 1 ddt_bias. One CTA per head; thread j adds column j
over (row, block) in order, so the sums are bitwise reproducible (no atomics). dD of shape (H,) sums its P
columns in order too.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, i32, ptr, strides
from kernel_src.families import expect_constants

THREADS = 256


class SsdBackwardReduce:
    family = "ssd_bwd_reduce"
    grid_rule = "heads"
    headdims = (64, 128)

    def __init__(self, headdim: int):
        expect_constants(self, headdim=headdim)
        self.headdim = headdim
        self.block = (THREADS, 1, 1)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = 4 * headdim   # the column sums (fp32)

    def params(self):
        return [
            ptr("partials", "fp32"), ptr("dD", "fp32"), ptr("dA", "fp32"), ptr("ddt_bias", "fp32"),
            i32("batch"), i32("nblocks"), i32("nheads"),
            *strides("partials", "batch", "block", "head"), *strides("dD", "head", "dim"), *strides("dA", "head"),
            *strides("ddt_bias", "head"),
            i32("has_dD"), i32("dD_per_head"), i32("has_ddt_bias"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[a.nheads, 1, 1], block=list(self.block), smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        P = self.headdim
        h, _, _ = cute.arch.block_idx()
        j, _, _ = cute.arch.thread_idx()
        partials = cute.make_tensor(a.partials, cute.make_layout((a.batch, a.nblocks, a.nheads, P + 2), stride=(
            a.stride_partials_batch, a.stride_partials_block, a.stride_partials_head, 1)))
        dD = cute.make_tensor(a.dD, cute.make_layout((a.nheads, P), stride=(a.stride_dD_head, a.stride_dD_dim)))
        dA = cute.make_tensor(a.dA, cute.make_layout((a.nheads,), stride=(a.stride_dA_head,)))
        ddt_bias = cute.make_tensor(a.ddt_bias, cute.make_layout((a.nheads,), stride=(a.stride_ddt_bias_head,)))
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
