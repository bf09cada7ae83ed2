"""ssd_bwd_reduce: the backward's fixed-order sums of partial results (the last kernel of ``ssd_bwd``).

Per head (the first ``nheads`` CTAs): dD[h, p] = Σ_tokens G·x, dA[h] = Σ_tokens Δ·da and ddt_bias[h] = Σ_tokens
ddt (BRIEF §2; the terms are defined in kernel_src/ssd_bwd_chunk.py) arrive as one partial sum per (row, 64-token
block, head) in ``partials`` (batch, nblocks, H, P + 2): columns 0..P-1 dD, P dA, P + 1 ddt_bias. Thread j adds
column j over (row, block) in order; dD of shape (H,) sums its P columns in order too.

Per group (the CTAs after those, only when ``head_splits`` > 1): ssd_bwd_chunk split each group's heads over
``head_splits`` CTAs, which left their shares of dB and dC in ``group_grads`` (2, head_splits, batch, L, G, N),
fp32; each thread adds one element's shares in split order and writes dB / dC in the I/O dtype.

Per token (the CTAs after those, only when ``d_state_splits`` > 1, N = 256): ssd_bwd_chunk split each group's columns
of N over ``d_state_splits`` CTAs, each leaving its fp32 shares of dx, dz and ddt in rows (row, part) of
``dx_shares`` / ``dz_shares`` (batch · d_state_splits, L, H, P) and ``ddt_shares`` (batch · d_state_splits, L, H)
(and its partials in rows (row, part) of ``partials``: dD's columns are the first part's alone); each thread adds one
8-column vector's shares in part order and writes it in the I/O dtype (16-byte accesses).

No atomics anywhere: the sums are bitwise reproducible.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from kernel_src.abi import bind, cutlass_dtype, i32, ptr, strides
from kernel_src.families import expect_constants
from kernel_src.ssd_tiles import CHUNK, vec, vector, view

THREADS = 256
GROUP_SUM_PER_THREAD = 4   # dB / dC elements a thread of a group-sum CTA finishes
SHARE_SUM_PER_THREAD = 4   # 8-column vectors of dx / dz (token, head) rows a thread of a share-sum CTA finishes


class SsdBackwardReduce:
    family = "ssd_bwd_reduce"
    grid_rule = "heads+group_sum_ctas+share_sum_ctas"
    headdims = (64, 128)
    io_dtypes = ("bf16", "fp16")
    # elements per CTA after the heads' (the plan sizes the grid by them)
    group_sum_elements = THREADS * GROUP_SUM_PER_THREAD
    share_sum_elements = THREADS * SHARE_SUM_PER_THREAD * CHUNK

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
            ptr("dx_shares", "fp32", align=16), ptr("dz_shares", "fp32", align=16), ptr("ddt_shares", "fp32"),
            ptr("dx", io, align=16), ptr("dz", io, align=16), ptr("ddt", io),
            i32("batch"), i32("seqlen"), i32("nblocks"), i32("nheads"), i32("ngroups"), i32("d_state"),
            i32("head_splits"), i32("group_sum_ctas"), i32("d_state_splits"), i32("share_sum_ctas"),
            *strides("partials", "batch", "block", "head"), *strides("dD", "head", "dim"), *strides("dA", "head"),
            *strides("ddt_bias", "head"),
            *strides("group_grads", "grad", "split", "batch", "seqlen", "group"),
            *strides("dB", "batch", "seqlen", "group"), *strides("dC", "batch", "seqlen", "group"),
            *(s for name in ("dx_shares", "dz_shares", "ddt_shares", "dx", "dz", "ddt")
              for s in strides(name, "batch", "seqlen", "head")),
            i32("has_dD"), i32("dD_per_head"), i32("has_ddt_bias"), i32("has_z"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[a.nheads + a.group_sum_ctas + a.share_sum_ctas, 1, 1], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        cta, _, _ = cute.arch.block_idx()
        j, _, _ = cute.arch.thread_idx()
        if cta < a.nheads:
            self._head_sums(a, cta, j)
        elif cta < a.nheads + a.group_sum_ctas:
            self._group_sums(a, cta - a.nheads, j)
        else:
            self._share_sums(a, cta - a.nheads - a.group_sum_ctas, j)

    @cute.jit
    def _head_sums(self, a, h, j):
        P = self.headdim
        # rows (row, part of N) with d_state_splits
        partials = view(a.partials, (a.batch, a.d_state_splits, a.nblocks, a.nheads, P + 2),
                        a.stride_partials_batch * a.d_state_splits, a.stride_partials_batch, a.stride_partials_block,
                        a.stride_partials_head, 1)
        dD = view(a.dD, (a.nheads, P), a.stride_dD_head, a.stride_dD_dim)
        dA = view(a.dA, (a.nheads,), a.stride_dA_head)
        ddt_bias = view(a.ddt_bias, (a.nheads,), a.stride_ddt_bias_head)
        smem = cutlass.utils.SmemAllocator()
        column_sums = smem.allocate_tensor(Float32, cute.make_layout((P,)), 16)

        total = Float32(0.0)
        if j < P + 2:
            parts = a.d_state_splits
            if j < P:  # (dD's terms are the first part's)
                parts = Int32(1)
            for b in range(a.batch):
                for part in range(parts):
                    for blk in range(a.nblocks):
                        total = total + partials[b, part, blk, h, j]
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
                b, t, g, n = _coordinates(e, (a.batch, L, G, N))
                db = Float32(0.0)
                dc = Float32(0.0)
                for split in range(a.head_splits):
                    db = db + shares[0, split, b, t, g, n]
                    dc = dc + shares[1, split, b, t, g, n]
                dB[b, t, g, n] = db.to(io_type)
                dC[b, t, g, n] = dc.to(io_type)

    @cute.jit
    def _share_sums(self, a, cta, j):
        io_type = cutlass_dtype(self.io_dtype)
        L, H, P, parts = a.seqlen, a.nheads, self.headdim, a.d_state_splits

        def per_head(name, rows):  # (rows, L, H, P) by the array's (batch, seqlen, head) strides, in 16-byte rows
            return view(getattr(a, name), (rows, L, H, P), vec(getattr(a, f"stride_{name}_batch")),
                        vec(getattr(a, f"stride_{name}_seqlen")), vec(getattr(a, f"stride_{name}_head")), 1)

        def per_token(name, rows):  # (rows, L, H)
            return view(getattr(a, name), (rows, L, H), getattr(a, f"stride_{name}_batch"),
                        getattr(a, f"stride_{name}_seqlen"), getattr(a, f"stride_{name}_head"))

        share_rows = a.batch * parts   # (row, part)
        dx_shares, dz_shares = per_head("dx_shares", share_rows), per_head("dz_shares", share_rows)
        ddt_shares = per_token("ddt_shares", share_rows)
        dx, dz, ddt = per_head("dx", a.batch), per_head("dz", a.batch), per_token("ddt", a.batch)
        chunks = P // CHUNK
        count = a.batch * L * H * chunks
        total = cute.make_rmem_tensor((CHUNK,), Float32)
        for k in cutlass.range_constexpr(SHARE_SUM_PER_THREAD):
            e = (cta * SHARE_SUM_PER_THREAD + k) * THREADS + j
            if e < count:
                b, t, h, c = _coordinates(e, (a.batch, L, H, chunks))
                self._add_shares(dx_shares, dx, b, parts, t, h, c, total, io_type)
                if a.has_z != 0:
                    self._add_shares(dz_shares, dz, b, parts, t, h, c, total, io_type)
                if c == 0:
                    ddt_sum = Float32(0.0)
                    for part in range(parts):
                        ddt_sum = ddt_sum + ddt_shares[b * parts + part, t, h]
                    ddt[b, t, h] = ddt_sum.to(io_type)

    @cute.jit
    def _add_shares(self, shares, grad, b, parts, t, h, c, total, io_type: cutlass.Constexpr):
        """grad[b, t, h, 8-column vector c] = the sum of its shares over the parts, in order (``total``: scratch)."""
        total.fill(0.0)
        for part in range(parts):
            share = vector(shares[b * parts + part, t, h, None], c).load()
            for e in cutlass.range_constexpr(CHUNK):
                total[e] = total[e] + share[e]
        vector(grad[b, t, h, None], c).store(total.load().to(io_type))


def _coordinates(e, shape):
    """The coordinates of element e of a row-major ``shape`` (the last mode fastest)."""
    coordinates = []
    for extent in reversed(shape[1:]):
        coordinates.append(e % extent)
        e = e // extent
    return (e, *reversed(coordinates))
