"""ssd_bwd_chunk: the backward's per-block gradients (the second kernel of ``ssd_bwd``).

Math (BRIEF §2; the adjoint of the forward's block form in kernel_src/ssd_fwd.py, as in the SSD paper's chunked
backward, arXiv:2405.21060 §6, and state-spaces/mamba's ``_chunk_scan_bwd_*`` kernels). For one sequence run
[s0, s1) of a 64-token block, with Λ the natural-log cumsum of a = Δ·A (the kernel holds cs = Λ·log2(e)),
h₀ / h_end the states entering / leaving the run (h₀ from the forward's 64-token ``states``, in the I/O dtype, or
the initial state, dh_end from ``dstates`` of the ssd_bwd_dstates pass, in the I/O dtype, or ``dfinal_states``),
G = dout ⊙ silu(z)::

    M_ij = (C_i·B_j) e^(Λ_i - Λ_j) [s0 <= j <= i < s1]     S_ij = M_ij Δ_j     Q_ij = G_i·x_j     W = Q ⊙ S
    V_ij = Q_ij e^(Λ_i - Λ_j) Δ_j [s0 <= j <= i < s1]     (W without the factor C_i·B_j)
    e_i  = e^(Λ_i - Λ_base)      w_j = e^(Λ_end - Λ_j) Δ_j     U_j = e^(Λ_end - Λ_j) · dh_end·B_j   (P)

    dx  = Sᵀ·G + Δ ⊙ U + D ⊙ G                      dz = dout ⊙ y ⊙ silu'(z),   y = S·x + y0 + D ⊙ x
    dB  = (Σ_heads V)ᵀ·C + Σ_heads (w ⊙ x)·dh_end      dC = (Σ_heads V)·B + Σ_heads (e ⊙ G)·h₀    (the group's heads)
    dΔ_j (direct) = Σ_i M_ij Q_ij + x_j·U_j
    dΛ_i = Σ_j W_ij - Σ_k W_ki + G_i·y0_i - Δ_i x_i·U_i + [i = s1 - 1] (e^(Λ_end - Λ_base)⟨dh_end, h₀⟩ + Σ_j Δ_j x_j·U_j)
    da_k = Σ_{i >= k in the run} dΛ_i ;  dΔ = dΔ (direct) + A·da ;  dA += Σ Δ·da ;  ddt = dΔ · dΔ/d(dt)

with y0_i = e_i · h₀·C_i (the entering state's share of y). ddt goes through dt_limit (zero gradient where
clamped, as torch.clamp) and softplus (sigmoid; the identity above 20). dD and ddt_bias are sums over tokens.

One CTA owns one (64-token block, group, row) and walks the heads of its group, adding each head's state terms of dB
and dC and its V to fp32 accumulators parked in shared memory (the V products follow the CTA's last head, once, with
Σ V rounded to the I/O dtype: with fp16 I/O that sum must stay within fp16's range, as the fp32 sum of C·Bᵀ's
gradient over heads that Triton's backward casts to fp16 must): every gradient is written by exactly one CTA, in a
fixed order, so the result is bitwise reproducible. When that gives too few CTAs to fill the GPU, the group's heads
are split over ``head_splits`` CTAs, each writing its share of dB and dC in fp32 to ``group_grads`` for
``ssd_bwd_reduce`` to add in split order. Per-(block, head) partial sums of dD (per P column), dA and ddt_bias go to
``partials`` and are summed in a fixed order by ``ssd_bwd_reduce``.

A head of P128 N128 does not fit in shared memory whole: the kernel walks it as ``head_slices`` = 2 heads of 64
columns of P (the "kernel's heads": h → real head h // 2, columns 64·(h % 2) on), with P64 N128's shared memory and
code. Q = G·xᵀ, G·y0, x·U and ⟨dh_end, h₀⟩ are sums over P, and everything above is linear in them, the W / V / S
terms, dB and dC included (Σ V sums over the kernel's heads), so each slice's row pass yields its share of dΔ, ddt,
dA and ddt_bias: the first slice keeps its shares in shared memory (``carry``) and the last adds them before it writes
ddt and the partials (fp32, in slice order). dx, dz and dD are per column. The runtime's call is the same as for any
variant (real heads; the kernel maps its heads through nested head modes of its views).

N 256 does not fit either (the group's parked dB and dC alone would take 128 KB): a group's columns of N are split
over ``d_state_splits`` = 2 CTAs of 128 columns each (grid z = batch · d_state_splits; the CTA's row mode holds its
part, so B, C, the states and their gradients are viewed at the part's columns), with N128's shared memory and code.
C·Bᵀ, h₀·C, dh_end·B and ⟨dh_end, h₀⟩ are sums over N, and every gradient above is linear in them, so each part
computes its share of dx, dz, ddt, dA and ddt_bias from its columns alone; D's terms (D ⊙ G in dx, D ⊙ x in y, dD)
are the first part's. dB and dC are per column, written by their part. The shares of dx, dz and ddt go to fp32
workspace arrays (rows (row, part)) that ``ssd_bwd_reduce`` adds in part order, as it adds the partials (dz's factor
then waits there in fp32, not rounded to the I/O dtype).

The products are bf16 / fp16 MMAs with fp32
accumulation (wgmma on sm_90a, warp MMAs elsewhere; operands rounded as the forward rounds them); everything per row
and the sums are fp32, but for dz's factor dout ⊙ silu'(z), rounded to the I/O dtype while it waits in dz.

Each head ends in two serial per-row chains, the next head's scan of Δ and this head's row pass (dΛ's suffix sums, dΔ,
ddt), which the next head's products wait for when the product warps run them. On sm_90a a third warpgroup takes
them and the head's sums that feed no product: its first warp (the "row warp") scans the next head while the
products of this one run and starts the row pass as soon as the products' sums are in shared memory; of the other
three ("side warps"), one sums dD and two the landed states' dot product ⟨dh_end, h₀⟩ (for the row pass). The third
warpgroup runs on 40 registers and the two product warpgroups get 232 each (``setmaxnreg``). Elsewhere (sm_100a's
warp-MMA products need 254 registers) the product warps do all of it, warp 0 scanning and warp 1 running the row pass
between the products.
"""

# (no "from __future__ import annotations": cute.struct reads its field annotations as live objects)
import copy
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.experimental.primitives import cp_async_bulk_prefetch, prefetch_l2

from kernel_src.abi import bind, cutlass_dtype, f32, i32, ptr, ssm_input_strides, strides
from kernel_src.families import expect_constants, experiment_enabled
from kernel_src.ssd_tiles import (CHUNK, SMEM_ALIGN, TILE, VECTOR, async_tile_copy, block_cumsum, copy_row,
                                  count_changes, fence_operands, first_set_bit, load_tile, make_mma, mn_view,
                                  next_change, role_arrive, role_sync, scale_rows, smem_layout, store_pairs,
                                  transposed, vec, vector, view, widen)
from kernel_src.ssm_math import delta_from_dt, delta_slope, sigmoid, warp_inclusive_scans

LOG2_E = math.log2(math.e)
WARPS = 8           # the warps of the products and tiles (the third warpgroup, when there is one, comes after them)
THREADS = WARPS * 32
# the third warpgroup (sm_90a): the row warp, then the side warps: one sums dD, two take the landed states' dot product
ROW_WARP = WARPS
DD_WARP = WARPS + 1
DOT_WARPS = 2
SIDE_THREADS = (1 + DOT_WARPS) * 32
# setmaxnreg shares: 2 x 232 + 40 per SM sub-partition (3 warps of 12); on average the 168 registers per thread that
# ptxas gives a 384-thread CTA (65536 / 384 in steps of 8), all that setmaxnreg can move (the build checks it)
PRODUCT_REGISTERS, SIDE_REGISTERS = 232, 40
# named barriers
PRODUCT_WARPS = 1   # the product warps alone
ROWS_READY = 2      # the product warps arrive when a head's sums are complete, the row warp waits
PROLOGUE = 3        # every warp: the sequence map, then each head's tiles, are in shared memory
GATED = 4           # the product warps arrive when G is final (with z), the dD warp waits
SIDE_DONE = 5       # the side warps arrive when done with a head's tiles, the product warps wait before reusing them
PARTIAL_EXTRA = 2   # partials[..., P] = dA, partials[..., P + 1] = ddt_bias
STATE_BATCH = 32    # state values a thread loads at once (at most)
PARTS = 3           # partial row / column sums: of Q ⊙ M over i, of G ⊙ y0 over P, of x ⊙ U over P
# the accumulators' warps: warp w holds the rows of group w % 4 and the columns of group w // 4 (with wgmma a half of
# the columns, with warp MMAs alternate 8-column blocks)
WARP_ROWS, WARP_COLUMNS = 4, 2
QUARTERS = THREADS // TILE  # the straddling sums' column pass: each thread sums one quarter of a column's rows
PARK_VECTOR = 4     # fp32 values of a parked accumulator moved per shared-memory access
STATE_COLUMNS = 128  # the most columns of N one CTA holds (d_state_splits)
SHARES = "shares"    # (a row mode's part stride: with d_state_splits, each part's share has its own rows)


class SsdBackwardChunk:
    family = "ssd_bwd_chunk"
    target_arch = None  # set by the build (compile_variant) before compiling
    grid_rule = "seqlen/64,groups*head_splits,batch*d_state_splits"
    headdims = (64, 128)
    d_states = (64, 128, 256)
    io_dtypes = ("bf16", "fp16")
    state_dtypes = ("fp32", "bf16", "fp16")
    # build experiments (scons experiment=NAME: cubins marked unvalidated; families.experiment_enabled tells the code)
    experiments = ("bwd_products_ahead",)

    def __init__(self, headdim: int, d_state: int, io_dtype: str, state_dtype: str):
        expect_constants(self, headdim=headdim, d_state=d_state, io_dtype=io_dtype, state_dtype=state_dtype)
        self.headdim, self.d_state, self.io_dtype, self.state_dtype = headdim, d_state, io_dtype, state_dtype
        # More than 128 columns of N (N256) do not fit in shared memory with the group's parked dB and dC: a group's
        # columns are split over d_state_splits CTAs, each writing fp32 shares of dx, dz and ddt for ssd_bwd_reduce
        # to add (module docstring).
        self.d_state_splits = -(-d_state // STATE_COLUMNS)
        self.state_columns = d_state // self.d_state_splits   # the columns of N a CTA holds
        # A head of more than 64 × 128 state values (P128 N128) does not fit in shared memory whole: it is walked as
        # head_slices heads of 64 columns of P each (the kernel's heads), whose ddt and dA / ddt_bias shares add up
        # (every gradient is linear in the per-column terms; module docstring).
        self.head_slices = headdim // 64 if headdim * self.state_columns > 64 * 128 else 1
        self.columns = headdim // self.head_slices   # the columns of P a kernel head holds
        self.warps = (WARP_ROWS, WARP_COLUMNS)
        self.cluster = (1, 1, 1)
        self.dynamic_smem = self._shared_storage(cutlass_dtype(io_dtype)).size_in_bytes()

    @property
    def warp_specialized(self) -> bool:
        """A third warpgroup (the row warp and the side warps) beside the product warps, setmaxnreg keeping the
        product warps' registers: sm_90a, the arch it was built, tuned and validated for (sm_100a's warp-MMA
        products need 254 registers, more than a third warpgroup would leave them)."""
        assert self.target_arch is not None
        return self.target_arch == "sm_90a"

    @property
    def threads(self):
        return THREADS + 128 * int(self.warp_specialized)

    @property
    def early_dz_factors(self) -> bool:
        """Whether _finish reads dz's factors into registers before the straddling sums (:meth:`_load_dz_factors`),
        so that their global loads' latency is hidden: on the warp-specialized CTA (sm_90a) without d_state_splits.
        Elsewhere _dz reads them just before their use: d_state_splits' fp32 shares, and the warp-MMA products
        (sm_100a, sm_80) without setmaxnreg, have no registers to hold them that long (both spilled)."""
        return self.warp_specialized and self.d_state_splits == 1

    def experiment_applies(self, name: str) -> bool:
        """Whether build experiment ``name`` changes this variant (families.new_kernel): bwd_products_ahead needs
        wgmma's asynchronous products, on the warp-specialized CTA without d_state_splits (at N 256 ptxas spills
        with it)."""
        return name == "bwd_products_ahead" and self.warp_specialized and self.d_state_splits == 1

    @property
    def products_ahead(self) -> bool:
        """Whether products are issued ahead and each waited for where it is first read, not at once (experiment
        ``bwd_products_ahead``: 1-2 % slower on the H200, not adopted): a run's C·Bᵀ beside B·dh_endᵀ, C·h₀ᵀ during U's
        pass, dB's and dC's state products as one group, dx's and y's products during the straddling sums."""
        return experiment_enabled(self, "bwd_products_ahead")

    @property
    def setmaxnreg_budget(self):
        """With warp specialization, the registers per thread the cubin's launch must give (its warps' setmaxnreg
        shares averaged: an increase only takes what decreases freed in the CTA, so with fewer the product warps
        would wait forever); else None."""
        if not self.warp_specialized:
            return None
        return -(-(WARPS * PRODUCT_REGISTERS + 4 * SIDE_REGISTERS) // (WARPS + 4))

    @property
    def block(self):
        return (self.threads, 1, 1)

    def params(self):
        io, st = self.io_dtype, self.state_dtype
        rows = 2 * VECTOR   # byte alignment of the arrays moved in 16-byte vectors
        # with d_state_splits, dx, ddt and dz are each split's fp32 shares, (batch · d_state_splits, ...)
        shares = "fp32" if self.d_state_splits > 1 else io
        return [
            ptr("x", io, align=rows), ptr("dt", io), ptr("A", "fp32"), ptr("B", io, align=rows),
            ptr("C", io, align=rows), ptr("D", "fp32"), ptr("z", io, align=rows), ptr("dt_bias", "fp32"),
            ptr("dout", io, align=rows), ptr("dx", shares, align=rows), ptr("ddt", shares), ptr("dB", io),
            ptr("dC", io), ptr("dz", shares, align=rows),
            ptr("initial_states", st), ptr("initial_state_indices", "int32"), ptr("states", io, align=rows),
            ptr("dfinal_states", "fp32"), ptr("dstates", io, align=rows), ptr("partials", "fp32"),
            ptr("group_grads", "fp32"),
            ptr("seq_idx", "int32"), ptr("cu_seqlens", "int32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("heads_per_group"), i32("head_splits"), i32("num_seqs"),
            i32("num_initial_slots"), i32("nblocks"),
            *ssm_input_strides(),
            *strides("dout", "batch", "seqlen", "head"), *strides("dx", "batch", "seqlen", "head"),
            *strides("ddt", "batch", "seqlen", "head"), *strides("dB", "batch", "seqlen", "group"),
            *strides("dC", "batch", "seqlen", "group"), *strides("dz", "batch", "seqlen", "head"),
            *strides("initial_states", "slot", "head"), *strides("initial_state_indices", "seq"),
            *strides("states", "batch", "block", "head"), *strides("dfinal_states", "seq", "head"),
            *strides("dstates", "batch", "block", "head"), *strides("partials", "batch", "block", "head"),
            *strides("group_grads", "grad", "split", "batch", "seqlen", "group"),
            *strides("seq_idx", "batch", "seqlen"), *strides("cu_seqlens", "seq"),
            i32("has_D"), i32("has_z"), i32("has_dt_bias"), i32("dt_softplus"),
            i32("has_initial_states"), i32("has_initial_state_indices"), i32("has_dfinal_states"),
            i32("has_seq_idx"), i32("has_cu_seqlens"),
            f32("dt_min"), f32("dt_max"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        self.kernel(args).launch(grid=[a.nblocks, a.nheads // a.heads_per_group * a.head_splits,
                                       a.batch * self.d_state_splits],
                                 block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream, min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        P, N = self.columns, self.state_columns
        io_type = cutlass_dtype(self.io_dtype)
        # row: with d_state_splits, (row of the batch) · d_state_splits + (the CTA's part of N); every view takes it
        # as its row (a nested mode: the part's columns of the state arrays, B and C, its shares of the outputs)
        blk, group_split, row = cute.arch.block_idx()
        g = group_split // a.head_splits
        split = group_split % a.head_splits
        heads_per_group = a.heads_per_group * self.head_slices   # the kernel's heads (head_slices)
        heads_per_split = heads_per_group // a.head_splits
        tid, _, _ = cute.arch.thread_idx()
        L, H = a.seqlen, a.nheads
        G = H // a.heads_per_group
        block_start = blk * TILE
        rows = cute.math.min(L - block_start, Int32(TILE))

        def heads(stride, slice_stride):
            # a per-head array's head mode, indexed by the kernel's head h: real head h // head_slices, its slice
            # h % head_slices (of P columns, slice_stride apart; 0 for per-head values the slices share)
            if cutlass.const_expr(self.head_slices == 1):
                return H, stride
            return (self.head_slices, H), (slice_stride, stride)

        def rows_of(count, stride, part_stride):
            # a row mode (count rows, stride apart) indexed by the CTA's row: its part of N part_stride apart (0 for
            # inputs; N columns for B, C and the states; a whole array of rows for the outputs' shares)
            if cutlass.const_expr(self.d_state_splits == 1):
                return count, stride
            if cutlass.const_expr(part_stride is SHARES):
                return (self.d_state_splits, count), (stride, stride * self.d_state_splits)
            return (self.d_state_splits, count), (part_stride, stride)

        def per_head_value(pointer, name):  # an (H,) fp32 array
            head_shape, head_stride = heads(getattr(a, f"stride_{name}_head"), 0)
            return view(pointer, (head_shape,), head_stride)

        def per_head(pointer, name, part_stride=0):  # a (batch, L, H, P) array whose rows move in 16-byte vectors
            head_shape, head_stride = heads(vec(getattr(a, f"stride_{name}_head")), P)
            batch_shape, batch_stride = rows_of(a.batch, vec(getattr(a, f"stride_{name}_batch")), part_stride)
            return view(pointer, (batch_shape, L, head_shape, P), batch_stride,
                        vec(getattr(a, f"stride_{name}_seqlen")), head_stride, 1)

        def per_token(pointer, name, part_stride=0):  # a (batch, L, H) array
            head_shape, head_stride = heads(getattr(a, f"stride_{name}_head"), 0)
            batch_shape, batch_stride = rows_of(a.batch, getattr(a, f"stride_{name}_batch"), part_stride)
            return view(pointer, (batch_shape, L, head_shape), batch_stride, getattr(a, f"stride_{name}_seqlen"),
                        head_stride)

        def per_group(pointer, name, vector):  # a (batch, L, G, N) array: the CTA's part of N
            batch_stride = getattr(a, f"stride_{name}_batch")
            seq_stride = getattr(a, f"stride_{name}_seqlen")
            group_stride = getattr(a, f"stride_{name}_group")
            if cutlass.const_expr(vector):
                batch_stride, seq_stride, group_stride = vec(batch_stride), vec(seq_stride), vec(group_stride)
            batch_shape, batch_stride = rows_of(a.batch, batch_stride, N)
            return view(pointer, (batch_shape, L, G, N), batch_stride, seq_stride, group_stride, 1)

        def state_blocks(pointer, name, first, first_dim):
            # (first, H, P, N) of contiguous P × d_state blocks, indexed by _state_row (the CTA's part of N)
            head_shape, head_stride = heads(getattr(a, f"stride_{name}_head"), P * self.d_state)
            first_shape, first_stride = rows_of(first, getattr(a, f"stride_{name}_{first_dim}"), N)
            return view(pointer, (first_shape, head_shape, P, N), first_stride, head_stride, self.d_state, 1)

        def block_states(pointer, name):  # the workspace's (batch, nblocks, H, P, N): the CTA's part of N
            head_shape, head_stride = heads(vec(getattr(a, f"stride_{name}_head")), P * self.d_state)
            batch_shape, batch_stride = rows_of(a.batch, vec(getattr(a, f"stride_{name}_batch")), N)
            return view(pointer, (batch_shape, a.nblocks, head_shape, P, N), batch_stride,
                        vec(getattr(a, f"stride_{name}_block")), head_stride, self.d_state, 1)

        D_heads, D_head_stride = heads(a.stride_D_head, P * a.stride_D_dim)
        partial_heads, partial_head_stride = heads(a.stride_partials_head, P)
        partial_rows, partial_row_stride = rows_of(a.batch, a.stride_partials_batch, SHARES)
        grads_rows, grads_row_stride = rows_of(a.batch, a.stride_group_grads_batch, N)
        seq_idx_rows, seq_idx_row_stride = rows_of(a.batch, a.stride_seq_idx_batch, 0)
        t = Tensors(
            x=per_head(a.x, "x"), z=per_head(a.z, "z"),
            dout=per_head(a.dout, "dout"), dx=per_head(a.dx, "dx", SHARES), dz=per_head(a.dz, "dz", SHARES),
            dt=per_token(a.dt, "dt"), ddt=per_token(a.ddt, "ddt", SHARES),
            A=per_head_value(a.A, "A"), dt_bias=per_head_value(a.dt_bias, "dt_bias"),
            B=per_group(a.B, "B", True), C=per_group(a.C, "C", True),
            dB=per_group(a.dB, "dB", False), dC=per_group(a.dC, "dC", False),
            D=view(a.D, (D_heads, P), D_head_stride, a.stride_D_dim),
            initial=state_blocks(a.initial_states, "initial_states", a.num_initial_slots, "slot"),
            initial_indices=view(a.initial_state_indices, (a.num_seqs,), a.stride_initial_state_indices_seq),
            dfinal=state_blocks(a.dfinal_states, "dfinal_states", a.num_seqs, "seq"),
            states=block_states(a.states, "states"), dstates=block_states(a.dstates, "dstates"),
            # (with head slices, a head's dA and ddt_bias shares land after its last slice's P columns: at P + 0, 1)
            partials=view(a.partials, (partial_rows, a.nblocks, partial_heads, P + PARTIAL_EXTRA), partial_row_stride,
                          a.stride_partials_block, partial_head_stride, 1),
            group_grads=view(a.group_grads, (2, a.head_splits, grads_rows, L, G, N), a.stride_group_grads_grad,
                             a.stride_group_grads_split, grads_row_stride, a.stride_group_grads_seqlen,
                             a.stride_group_grads_group, 1),
            seq_idx=view(a.seq_idx, (seq_idx_rows, a.seqlen), seq_idx_row_stride, a.stride_seq_idx_seqlen),
        )

        storage = cutlass.utils.SmemAllocator().allocate(self._shared_storage(io_type))
        sm = Shared(storage, P, N, self.head_slices, t.dx.element_type)

        mma = self._mma(io_type, tid)
        g2s = async_tile_copy(io_type, THREADS)

        if cute.arch.warp_idx() == 0:
            self._sequence_map(a, t, sm, row, block_start, rows, cute.arch.lane_idx())
        first_head = g * heads_per_group + split * heads_per_split
        if cutlass.const_expr(self.warp_specialized):
            if cute.arch.warp_idx() < WARPS:
                cute.arch.warpgroup_reg_alloc(PRODUCT_REGISTERS)
                self._load_BC(a, t, sm, mma, g2s, row, g, blk, L, tid)
                self._sync_all()
                self._group(a, t, sm, mma, g2s, row, g, first_head, heads_per_split, blk, block_start, rows,
                            tid, io_type)
            else:
                cute.arch.warpgroup_reg_dealloc(SIDE_REGISTERS)
                self._sync_all()
                if cute.arch.warp_idx() == ROW_WARP:
                    self._row_warp(a, t, sm, row, first_head, heads_per_split, blk, block_start, rows, io_type)
                else:
                    self._side_warp(a, t, sm, row, first_head, heads_per_split, blk, rows)
        else:
            self._load_BC(a, t, sm, mma, g2s, row, g, blk, L, tid)
            self._sync_all()
            self._group(a, t, sm, mma, g2s, row, g, first_head, heads_per_split, blk, block_start, rows, tid,
                        io_type)

    def _batch_row(self, row):
        """The row of the batch of the CTA's ``row`` (with d_state_splits, kernel() says how it holds the part of N)."""
        return row // self.d_state_splits

    def _first_part(self, row):
        """Whether the CTA holds the first part of N (or all of it): D's terms (dx += D ⊙ G, y += D ⊙ x) are its, and
        ssd_bwd_reduce sums its dD partials only."""
        return row % self.d_state_splits == 0

    def _state_row(self, number, count, row):
        """The row of sequence or slot ``number`` (clamped to [0, count): an unused one reads in bounds) in the
        per-sequence state arrays' view (initial_states, dfinal_states), in the CTA's part of N."""
        number = cute.math.max(cute.math.min(number, count - 1), Int32(0))
        return number * self.d_state_splits + row % self.d_state_splits

    @cute.jit
    def _load_BC(self, a, t, sm, mma, g2s, row, g, blk, L, tid):
        """The kernel group's B and C tiles of the block (its part of N), by the product warps."""
        N = self.state_columns
        thr = g2s.get_slice(tid)
        load_tile(g2s, thr, t.B[row, None, g, None], cute.make_identity_tensor((L, N)), sm.B, (TILE, N), (blk, 0), L)
        load_tile(g2s, thr, t.C[row, None, g, None], cute.make_identity_tensor((L, N)), sm.C, (TILE, N), (blk, 0), L)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        fence_operands(mma)  # (wgmma reads the tiles through the async proxy)

    def _sync(self):
        """A barrier of the product warps."""
        if self.warp_specialized:
            cute.arch.barrier(barrier_id=PRODUCT_WARPS, number_of_threads=THREADS)
        else:
            cute.arch.sync_threads()

    def _sync_all(self):
        """A barrier of every warp."""
        if self.warp_specialized:
            role_sync(PROLOGUE, self.threads)
        else:
            cute.arch.sync_threads()

    @cute.jit
    def _row_warp(self, a, t, sm, row, first_head, heads, blk, block_start, rows, io_type: cutlass.Constexpr):
        """The row warp's walk over the CTA's heads (the first head scanned before the products start)."""
        lane = cute.arch.lane_idx()
        first, first_end = self._first_run(sm)
        landed_end = first_end * self._states_from_workspace(sm, first, first_end, rows)
        head_dt = self._load_head_dt(a, t, sm, row, first_head, block_start, lane)
        self._scan_head(a, sm.for_head(first_head % 2), head_dt, lane)
        for k in range(heads):
            self._row_head(a, t, sm, row, first_head + k, k + 1 < heads, blk, block_start, rows, landed_end, lane,
                           io_type)

    @cute.jit
    def _side_warp(self, a, t, sm, row, first_head, heads, blk, rows):
        """The side warps' walk over the CTA's heads: dD's partial sums (the dD warp) and, when the first run's
        states land from the workspace, their dot product ⟨dh_end, h₀⟩ (the dot warps, for the row pass), off the
        product warps' path."""
        first, first_end = self._first_run(sm)
        landed = self._states_from_workspace(sm, first, first_end, rows)
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        for k in range(heads):
            self._sync_all()  # the head's prologue
            if warp == DD_WARP:
                if a.has_z != 0:
                    role_sync(GATED, THREADS + 32)
                self._dD_partials(t, sm, row, blk, first_head + k, lane)
            else:
                if landed != 0:
                    self._states_dot(sm, (warp - DD_WARP - 1) * 32 + lane, DOT_WARPS * 32, sm.landed_dot)
            role_arrive(SIDE_DONE, THREADS + SIDE_THREADS)

    @cute.jit
    def _dD_partials(self, t, sm, row, blk, h, lane):
        """The dD warp: head h's dD partial sums of the block, Σ_i G_ip x_ip, into partials."""
        sums = self._dD_columns(sm, lane, 32)
        head_partials = t.partials[row, blk, h, None]
        if lane < self.columns // CHUNK:
            for e in cutlass.range_constexpr(CHUNK):
                head_partials[lane * CHUNK + e] = sums[e]

    @cute.jit
    def _row_head(self, a, t, sm, row, h, has_next, blk, block_start, rows, landed_end, lane,
                  io_type: cutlass.Constexpr):
        """The row warp during head h: the next head's dt (loaded before h's prologue, scanned after it, while the
        products of h run), then h's row pass once the products' sums are in shared memory (ROWS_READY)."""
        following = sm.for_head((h + 1) % 2)
        head_dt = _no_head_dt(t)
        if has_next:
            head_dt = self._load_head_dt(a, t, sm, row, h + 1, block_start, lane)
        self._sync_all()  # head h's prologue
        if has_next:
            self._scan_head(a, following, head_dt, lane)
        role_sync(ROWS_READY, THREADS + 32)
        self._rows(a, t, sm.for_head(h % 2), sm.part_slots, row, h, blk, block_start, rows, landed_end, lane,
                   io_type)

    @cute.jit
    def _group(self, a, t, sm, mma, g2s, row, g, first_head, heads_per_split, blk, block_start, rows, tid,
               io_type: cutlass.Constexpr):
        N = self.state_columns
        # dB and dC of the group, and the sum of the heads' V: fp32 accumulators parked in shared memory
        acc = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, N)), Float32)
        acc.fill(0.0)
        _park(acc, sm.dB[tid, None])
        _park(acc, sm.dC[tid, None])
        v_sum = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        v_sum.fill(0.0)
        _park(v_sum, sm.V_sum[tid, None])
        if cutlass.const_expr(self.warp_specialized):
            head_dt = _no_head_dt(t)
        else:
            head_dt = self._load_head_dt(a, t, sm, row, first_head, block_start, cute.arch.lane_idx())
        # the block's first sequence run, the same for every head, and whether its states land from the workspace
        first, first_end = self._first_run(sm)
        first_run = (first, first_end, self._states_from_workspace(sm, first, first_end, rows))
        self._land_states(t, sm, g2s, row, first_head, blk, first_run[2], tid)
        for k in range(heads_per_split):
            head_dt = self._head(a, t, sm, mma, g2s, row, first_head + k, k + 1 < heads_per_split, head_dt, blk,
                                 block_start, rows, first_run, tid, io_type)

        # Σ_heads Vᵀ·C = (Σ_heads V)ᵀ·C and Σ_heads V·B = (Σ_heads V)·B: the V products once, with the sum rounded
        # to the I/O dtype into S's tile (free after the last head)
        _unpark(v_sum, sm.V_sum[tid, None])
        store_pairs(mn_view(v_sum), mn_view(mma.thr.partition_C(sm.S)), io_type)
        fence_operands(mma)
        self._sync()
        # dB and dC, or with the group's heads split over CTAs this split's fp32 share (ssd_bwd_reduce adds them)
        coords = mma.thr.partition_C(cute.make_identity_tensor((TILE, N)))
        shares = t.group_grads
        dB_with_V = (t.dB, sm.dB, transposed(sm.S, TILE, TILE), True, transposed(sm.C, TILE, N))   # += Vᵀ·C
        dC_with_V = (t.dC, sm.dC, sm.S, False, transposed(sm.B, TILE, N))                          # += V·B
        for which, (grad, parked, v_tile, v_transposed, other) in enumerate((dB_with_V, dC_with_V)):
            _unpark(acc, parked[tid, None])
            mma.gemm(acc, v_tile, other, TILE // 16, a_transposed=v_transposed, b_transposed=True)
            if a.head_splits == 1:
                for e in cutlass.range_constexpr(cute.size(acc)):
                    i = coords[e][0]
                    if i < rows:
                        grad[row, block_start + i, g, coords[e][1]] = acc[e].to(io_type)
            else:
                # (the split derived here, not kept from the start: through the heads it would take a register the
                # product warps do not have at N 256)
                split = first_head // heads_per_split % a.head_splits
                for e in cutlass.range_constexpr(cute.size(acc)):
                    i = coords[e][0]
                    if i < rows:
                        shares[which, split, row, block_start + i, g, coords[e][1]] = acc[e]

    def _mma(self, io_type, tid):
        """sm_90a: wgmma, two warpgroups side by side along N reading both operands from the shared tiles; else the
        warp MMAs (4 × 2 warps) read with ldmatrix."""
        assert self.target_arch is not None, "ssd_bwd_chunk's MMAs follow the target: set target_arch first"
        return make_mma(io_type, tid, self.warps, warpgroups=2 if self.target_arch == "sm_90a" else 0)

    def _shared_storage(self, io_type):
        P, N = self.columns, self.state_columns
        head_slices = self.head_slices

        @cute.struct
        class SharedStorage:
            B: cute.struct.Align[cute.struct.MemRange[io_type, TILE * N], SMEM_ALIGN]
            C: cute.struct.Align[cute.struct.MemRange[io_type, TILE * N], SMEM_ALIGN]
            x: cute.struct.Align[cute.struct.MemRange[io_type, TILE * P], SMEM_ALIGN]
            gated: cute.struct.Align[cute.struct.MemRange[io_type, TILE * P], SMEM_ALIGN]   # dout, then G
            # z while G is computed, then the run's (w ⊙ x) and (e ⊙ G)
            scaled: cute.struct.Align[cute.struct.MemRange[io_type, 2 * TILE * P], SMEM_ALIGN]
            S: cute.struct.Align[cute.struct.MemRange[io_type, TILE * TILE], SMEM_ALIGN]  # at the end, Σ_heads V
            # h₀ and dh_end of a run, then (fp32) W for the straddling sums
            states: cute.struct.Align[cute.struct.MemRange[io_type, 2 * P * N], SMEM_ALIGN]
            straddle: cute.struct.Align[cute.struct.MemRange[Float32, QUARTERS * TILE], SMEM_ALIGN]
            dD_slices: cute.struct.Align[cute.struct.MemRange[Float32, WARPS * P], SMEM_ALIGN]  # without side warps
            D: cute.struct.Align[cute.struct.MemRange[Float32, P], SMEM_ALIGN]
            # Δ, its cumsum and dΔ/d(dt) per row, one set per head parity: the next head's scan writes its set
            # while this head's row pass still reads the other
            delta: cute.struct.Align[cute.struct.MemRange[Float32, 2 * TILE], SMEM_ALIGN]
            cs: cute.struct.Align[cute.struct.MemRange[Float32, 2 * TILE], SMEM_ALIGN]
            slope: cute.struct.Align[cute.struct.MemRange[Float32, 2 * TILE], SMEM_ALIGN]
            last: cute.struct.Align[cute.struct.MemRange[Float32, TILE], SMEM_ALIGN]
            suffix: cute.struct.Align[cute.struct.MemRange[Float32, TILE + 1], SMEM_ALIGN]
            suffix_q: cute.struct.Align[cute.struct.MemRange[Float32, TILE + 1], SMEM_ALIGN]
            # the partial sums of the warps sharing a column (Q ⊙ M: one slot per row group) or a row (G ⊙ y0, x ⊙ U:
            # one per column group), each entry written by one warp, added in warp order
            parts: cute.struct.Align[cute.struct.MemRange[Float32, PARTS * WARP_ROWS * TILE], SMEM_ALIGN]
            dot: cute.struct.Align[cute.struct.MemRange[Float32, WARPS], SMEM_ALIGN]
            landed_dot: cute.struct.Align[cute.struct.MemRange[Float32, DOT_WARPS], SMEM_ALIGN]  # the dot warps'
            seq: cute.struct.Align[cute.struct.MemRange[Int32, TILE], SMEM_ALIGN]
            run_start: cute.struct.Align[cute.struct.MemRange[Int32, TILE], SMEM_ALIGN]
            run_end: cute.struct.Align[cute.struct.MemRange[Int32, TILE], SMEM_ALIGN]
            masks: cute.struct.Align[cute.struct.MemRange[Int32, 5], SMEM_ALIGN]  # starts lo/hi, in lo/hi, continues
            # Q = G·xᵀ (then W) and the heads' sum of V as MMA fragments, thread-major (registers are the scarce
            # resource here)
            Q: cute.struct.Align[cute.struct.MemRange[Float32, TILE * TILE], SMEM_ALIGN]
            V_sum: cute.struct.Align[cute.struct.MemRange[Float32, TILE * TILE], SMEM_ALIGN]
            dB: cute.struct.Align[cute.struct.MemRange[Float32, TILE * N], SMEM_ALIGN]   # the group's dB, parked
            dC: cute.struct.Align[cute.struct.MemRange[Float32, TILE * N], SMEM_ALIGN]
            if head_slices > 1:  # a real head's ddt and partials over its slices (_add_slices)
                carry: cute.struct.Align[cute.struct.MemRange[Float32, TILE + PARTIAL_EXTRA], SMEM_ALIGN]

        return SharedStorage

    @cute.jit
    def _sequence_map(self, a, t, sm, row, block_start, rows, lane):
        """Warp 0: which sequence each row of the block belongs to (its number for the state arrays, -1 outside
        every sequence), the masks of rows that start a run and of rows inside a sequence, and whether row 0
        continues the sequence of the row before the block."""
        key0, in0, num0 = self._sequence_of(a, t, row, block_start + lane, rows + block_start)
        key1, in1, num1 = self._sequence_of(a, t, row, block_start + lane + 32, rows + block_start)
        before_key, before_in, _ = self._sequence_of(a, t, row, block_start - 1, rows + block_start)
        prev0 = cute.arch.shuffle_sync_up(key0, 1)
        prev_in0 = cute.arch.shuffle_sync_up(in0, 1)
        prev1 = cute.arch.shuffle_sync_up(key1, 1)
        prev_in1 = cute.arch.shuffle_sync_up(in1, 1)
        last_key0 = cute.arch.shuffle_sync(key0, 31)
        last_in0 = cute.arch.shuffle_sync(in0, 31)
        if lane == 0:
            prev0 = before_key
            prev_in0 = before_in
            prev1 = last_key0
            prev_in1 = last_in0
        # change: a sequence starts at the row; start: a run of the block starts there (also row 0 continuing one)
        change0 = Int32(0)
        change1 = Int32(0)
        if in0 != 0:
            if (prev_in0 == 0) | (prev0 != key0):
                change0 = Int32(1)
        if in1 != 0:
            if (prev_in1 == 0) | (prev1 != key1):
                change1 = Int32(1)
        start0 = change0
        continues = Int32(0)
        if (lane == 0) & (in0 != 0):
            start0 = Int32(1)
            continues = Int32(1) - change0
        if a.has_seq_idx != 0:
            if (a.has_initial_states != 0) | (a.has_dfinal_states != 0):
                # sequences of a seq_idx row are numbered 0, 1, ... along it (states only at batch 1)
                before = count_changes(t.seq_idx, row, Int32(0), block_start, lane)
                counted0 = change0
                if block_start + lane == 0:  # the row's first token starts sequence 0
                    counted0 = Int32(0)
                mask0 = Int32(cute.arch.vote_ballot_sync(counted0 != 0))
                mask1 = Int32(cute.arch.vote_ballot_sync(change1 != 0))
                upto = Int32(-1)  # lanes <= this one
                if lane < 31:
                    upto = (Int32(2) << lane) - Int32(1)
                num0 = before + Int32(cute.arch.popc(mask0 & upto))
                num1 = before + Int32(cute.arch.popc(mask0)) + Int32(cute.arch.popc(mask1 & upto))
        seq0 = Int32(-1)
        seq1 = Int32(-1)
        if in0 != 0:
            seq0 = num0
        if in1 != 0:
            seq1 = num1
        seq_map, masks = sm.seq, sm.masks
        seq_map[lane] = seq0
        seq_map[lane + 32] = seq1
        starts_lo = cute.arch.vote_ballot_sync(start0 != 0)
        starts_hi = cute.arch.vote_ballot_sync(change1 != 0)
        in_lo = cute.arch.vote_ballot_sync(in0 != 0)
        in_hi = cute.arch.vote_ballot_sync(in1 != 0)
        continues = cute.arch.shuffle_sync(continues, 0)
        if lane == 0:
            masks[0] = Int32(starts_lo)
            masks[1] = Int32(starts_hi)
            masks[2] = Int32(in_lo)
            masks[3] = Int32(in_hi)
            masks[4] = continues

    @cute.jit
    def _sequence_of(self, a, t, row, tok, stop):
        """(key, inside, number) of token ``tok`` (< stop, >= 0): the key that changes between sequences, whether
        the token is inside one, and the sequence's number for the state arrays (seq_idx rows: filled later)."""
        key = Int32(0)
        inside = Int32(0)
        number = self._batch_row(row)
        if (tok >= 0) & (tok < stop):
            inside = Int32(1)
            if a.has_seq_idx != 0:
                key = t.seq_idx[row, tok]
                number = Int32(0)
            if a.has_cu_seqlens != 0:
                cu = view(a.cu_seqlens, (a.num_seqs + 1,), a.stride_cu_seqlens_seq)
                # the last k with cu[k] <= tok (entries clamped to [0, L], as the forward clamps them)
                lo = Int32(0)
                hi = a.num_seqs
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if cute.math.min(cute.math.max(cu[mid], Int32(0)), a.seqlen) <= tok:
                        lo = mid
                    else:
                        hi = mid - 1
                inside = Int32(0)
                if cute.math.min(cute.math.max(cu[0], Int32(0)), a.seqlen) <= tok:
                    if lo < a.num_seqs:
                        if tok < cute.math.min(cute.math.max(cu[lo + 1], Int32(0)), a.seqlen):
                            inside = Int32(1)
                key = lo
                number = lo
        return key, inside, number

    @cute.jit
    def _head(self, a, t, sm, mma, g2s, row, h, has_next, head_dt, blk, block_start, rows, first_run, tid,
              io_type: cutlass.Constexpr):
        """Head h's gradients of the block, from warp 0's ``head_dt`` (:meth:`_load_head_dt`; unused with a row
        warp) and the block's ``first_run`` (start, end, whether its states land from the workspace); returns the
        next head's dt, which warp 0 loads during this head's last steps."""
        sm = sm.for_head(h % 2)
        P = self.columns
        L = a.seqlen
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        thr = g2s.get_slice(tid)
        ident_x = cute.make_identity_tensor((L, P))
        sZ = cute.make_tensor(sm.scaled.iterator, smem_layout((TILE, P)))

        # (the last head's _finish waited for every warp to be done with its tiles)
        load_tile(g2s, thr, t.x[row, None, h, None], ident_x, sm.x, (TILE, P), (blk, 0), L)
        load_tile(g2s, thr, t.dout[row, None, h, None], ident_x, sm.G, (TILE, P), (blk, 0), L)
        if a.has_z != 0:
            load_tile(g2s, thr, t.z[row, None, h, None], ident_x, sZ, (TILE, P), (blk, 0), L)
        cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.target_arch != "sm_80"):  # (the prefetches below: arch=sm80's NVVM refused them)
            if has_next:
                self._prefetch_rows(a, t, row, h + 1, block_start, rows, tid)
                if tid == 2 * 32:
                    self._prefetch_states(t, row, h + 1, blk)
        if cutlass.const_expr(not self.warp_specialized):
            if warp_id == 0:
                self._scan_head(a, sm, head_dt, lane)
        # the first run's states: landed by _land_states when they are the workspace's, else loaded while the tiles
        # are in flight (later runs load theirs in turn)
        starts_lo = sm.masks[0]
        starts_hi = sm.masks[1]
        outside_lo = ~sm.masks[2]
        outside_hi = ~sm.masks[3]
        first, s1, landed = first_run
        s0 = first
        if first < TILE:
            if landed == 0:
                self._load_states(a, t, sm, row, h, blk, s0, s1, rows, tid, io_type)
        sD, s_last, s_parts = sm.D, sm.last, sm.parts
        if tid < P:
            d_value = Float32(0.0)
            if a.has_D != 0:
                if self._first_part(row):
                    d_value = t.D[h, tid]
            sD[tid] = d_value
        _zero(sm.S, tid)  # entries outside every run stay zero
        cute.arch.cp_async_wait_group(0)
        fence_operands(mma)
        self._sync_all()
        if cutlass.const_expr(not self.warp_specialized):  # (else the dot warps take it)
            if landed != 0:
                self._states_dot(sm, tid, THREADS, sm.dot)
        # (zeroed only now: the row pass reads the last head's sums until it reaches the barrier above)
        if tid < TILE:
            s_last[tid] = Float32(0.0)
        for k in cutlass.range_constexpr(PARTS * WARP_ROWS * TILE // THREADS):
            s_parts[k * THREADS + tid] = Float32(0.0)

        if a.has_z != 0:
            self._gate(t, sm, mma, sZ, row, h, block_start, rows, tid, io_type)
            self._sync()
            if cutlass.const_expr(self.warp_specialized):
                role_arrive(GATED, THREADS + 32)

        _accumulate(mma, [(sm.Q[tid, None], sm.G, sm.x)], P // 16, fresh=True)   # Q = G·xᵀ
        if cutlass.const_expr(not self.warp_specialized):  # (else the dD warp sums it)
            sums = self._dD_columns(sm, tid, THREADS)
            if lane < P // CHUNK:
                vector(sm.dD_slices[warp_id, None], lane).store(sums.load())
        acc_dx = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P)), Float32)
        acc_dx.fill(0.0)
        acc_y = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P)), Float32)  # y, for dz (with z)
        acc_y.fill(0.0)

        while s0 < TILE:
            s1 = cute.math.min(next_change(starts_lo, starts_hi, s0), next_change(outside_lo, outside_hi, s0))
            if s0 != first:
                self._sync()
                self._load_states(a, t, sm, row, h, blk, s0, s1, rows, tid, io_type)
            landed_run = Int32(0)
            if cutlass.const_expr(self.warp_specialized):  # (the dot warps take a landed run's dot product)
                if (landed != 0) & (s0 == first):
                    landed_run = Int32(1)
            self._run(a, t, sm, mma, acc_dx, acc_y, row, h, blk, s0, s1, rows, landed_run, tid, io_type)
            s0 = next_change(starts_lo, starts_hi, s1 - 1)

        return self._finish(a, t, sm, mma, g2s, acc_dx, acc_y, row, h, has_next, head_dt, blk, block_start, rows,
                            landed, tid, io_type)

    @cute.jit
    def _prefetch_states(self, t, row, h, blk):
        """Head h's states of the block (the workspace's h₀ and dh_end, what a run continuing a sequence and ending
        at the block's end reads) into L2, while the head before it runs: its prologue then waits on L2, not HBM."""
        P, N = self.columns, self.state_columns
        for block in (t.states[row, cute.math.max(blk - 1, Int32(0)), h, None, None],
                      t.dstates[row, blk, h, None, None]):
            # (rows of d_state: the part's columns of the last row end the span)
            cp_async_bulk_prefetch(block.iterator, ((P - 1) * self.d_state + N) * (block.element_type.width // 8))

    @cute.jit
    def _prefetch_rows(self, a, t, row, h, block_start, rows, tid):
        """Head h's rows of x, dout and z into L2 while the head before it runs, a 128-byte line per thread and step
        (the prologue's tile loads waited on HBM). Per-line prefetches: bulk ones of the rows were slower."""
        per_line = 128 * 8 // t.x.element_type.width
        lines = cute.ceil_div(self.columns, per_line)
        for step in cutlass.range_constexpr(cute.ceil_div(3 * TILE * lines, THREADS)):
            k = step * THREADS + tid
            s = k // (3 * lines)
            which = k // lines % 3
            at = k % lines * per_line
            if s < rows:
                if which == 0:
                    prefetch_l2(t.x[row, block_start + s, h, None].iterator + at)
                if which == 1:
                    prefetch_l2(t.dout[row, block_start + s, h, None].iterator + at)
                if (which == 2) & (a.has_z != 0):
                    prefetch_l2(t.z[row, block_start + s, h, None].iterator + at)

    @cute.jit
    def _load_head_dt(self, a, t, sm, row, h, block_start, lane):
        """Head h's raw dt of the block's rows lane and lane + 32 inside a sequence (zero elsewhere), its dt_bias and
        A, for the warp that scans (without a row warp every warp loads the first head's; warp 0 alone the later
        ones). dt stays in the I/O dtype
        until _scan_head converts it: a conversion here would wait for the load."""
        raw0 = t.dt.element_type(0.0)
        raw1 = t.dt.element_type(0.0)
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = t.dt_bias[h]
        if sm.seq[lane] >= 0:
            raw0 = t.dt[row, block_start + lane, h]
        if sm.seq[lane + 32] >= 0:
            raw1 = t.dt[row, block_start + lane + 32, h]
        return raw0, raw1, bias, t.A[h]

    @cute.jit
    def _scan_head(self, a, sm, head_dt, lane):
        """Warp 0 or the row warp: Δ (zero outside every sequence), its cumsum of Δ·A·log2(e) and dΔ/d(dt) of the
        block's rows (the slope here, off the row pass's serial chain)."""
        raw0, raw1, bias, A = head_dt
        d0 = Float32(0.0)
        d1 = Float32(0.0)
        slope0 = Float32(0.0)
        slope1 = Float32(0.0)
        if sm.seq[lane] >= 0:
            d0 = delta_from_dt(raw0.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
            slope0 = delta_slope(raw0.to(Float32) + bias, a.dt_softplus, a.dt_min, a.dt_max)
        if sm.seq[lane + 32] >= 0:
            d1 = delta_from_dt(raw1.to(Float32), bias, a.dt_softplus, a.dt_min, a.dt_max)
            slope1 = delta_slope(raw1.to(Float32) + bias, a.dt_softplus, a.dt_min, a.dt_max)
        c0, c1 = block_cumsum(d0, d1, A * Float32(LOG2_E), lane)
        sm.delta[lane] = d0
        sm.delta[lane + 32] = d1
        sm.cs[lane] = c0
        sm.cs[lane + 32] = c1
        sm.slope[lane] = slope0
        sm.slope[lane + 32] = slope1

    @cute.jit
    def _gate(self, t, sm, mma, sZ, row, h, block_start, rows, tid, io_type: cutlass.Constexpr):
        """G = dout ⊙ silu(z) over dout's tile, fenced for the products, and dout ⊙ silu'(z) (zero outside every
        sequence) into dz, where _finish multiplies it by y once the head's y is known (shared memory has no room to
        keep it). The dz stores come after the proxy fence, whose MEMBAR would wait for them to land; the barrier
        after this still orders them before _finish's loads of them."""
        P = self.columns
        per_row = THREADS // TILE
        s = tid // per_row
        part = tid % per_row
        chunks = P // CHUNK
        inside = sm.seq[s] >= 0
        loaded = []  # (the share read before G overwrites dout: scale_rows says why)
        for k in cutlass.range_constexpr(chunks // per_row):
            chunk = part * (chunks // per_row) + k
            loaded.append((vector(sm.G[s, None], chunk).load(), vector(sZ[s, None], chunk).load()))
        factors = []
        for k in cutlass.range_constexpr(chunks // per_row):
            chunk = part * (chunks // per_row) + k
            dout = vector(sm.G[s, None], chunk)
            ds = widen(loaded[k][0])
            zs = widen(loaded[k][1])
            gated = cute.make_rmem_tensor((CHUNK,), Float32)
            dz = cute.make_rmem_tensor((CHUNK,), Float32)
            for e in cutlass.range_constexpr(CHUNK):
                sig = sigmoid(zs[e])
                gated[e] = ds[e] * zs[e] * sig
                dz[e] = Float32(cutlass.select_(inside, ds[e] * sig * (Float32(1.0) + zs[e] * (Float32(1.0) - sig)),
                                                Float32(0.0)))
            dout.store(gated.load().to(io_type))
            factors.append((chunk, dz.load().to(t.dz.element_type)))
        fence_operands(mma)
        if s < rows:
            for chunk, values in factors:
                vector(t.dz[row, block_start + s, h, None], chunk).store(values)

    @cute.jit
    def _first_run(self, sm):
        """The block's first sequence run [s0, s1), the same for every head (s0 = TILE: no row is in a sequence)."""
        starts_lo = sm.masks[0]
        starts_hi = sm.masks[1]
        first = first_set_bit(starts_lo, starts_hi)
        return first, cute.math.min(next_change(starts_lo, starts_hi, first),
                                    next_change(~sm.masks[2], ~sm.masks[3], first))

    @cute.jit
    def _states_from_workspace(self, sm, first, s1, rows) -> Int32:
        """1 when the first run [first, s1) (:meth:`_first_run`) takes h₀ and dh_end both from the workspace (it
        continues the sequence of the block before and reaches the block's end, as inside every long sequence): they
        then land by cp.async."""
        landed = Int32(0)
        if (first == 0) & (sm.masks[4] != 0) & (s1 == rows):
            landed = Int32(1)
        return landed

    @cute.jit
    def _land_states(self, t, sm, g2s, row, h, blk, landed, tid):
        """cp.async of head h's h₀ and dh_end of the first run straight into their tiles (the I/O dtype, as the
        products take them) when ``landed``, they are the workspace's (:meth:`_states_from_workspace`); the head's
        tile wait covers them. Issued as soon as the tiles are free, so that they are off the head's critical path."""
        P, N = self.columns, self.state_columns
        if landed != 0:
            thr = g2s.get_slice(tid)
            whole = cute.make_identity_tensor((P, N))
            load_tile(g2s, thr, t.states[row, blk - 1, h, None, None], whole, sm.h0, (P, N), (0, 0), P)
            load_tile(g2s, thr, t.dstates[row, blk, h, None, None], whole, sm.dh, (P, N), (0, 0), P)
        cute.arch.cp_async_commit_group()

    def _state_vector(self, q, k: int, threads: int = THREADS):
        """(row of P, 8-column chunk of N) of the k-th vector of a P × N state that thread q of ``threads`` takes."""
        N = self.state_columns
        return k * (threads * CHUNK // N) + q // (N // CHUNK), q % (N // CHUNK)

    @cute.jit
    def _states_dot(self, sm, q, threads: int, dst):
        """⟨dh_end, h₀⟩ (fp32) from the landed states tiles by ``threads`` threads (q: this one's index among them):
        dst[q // 32] = the share of q's warp (with THREADS, the vectors and order of :meth:`_load_states`)."""
        P, N = self.columns, self.state_columns
        dot = Float32(0.0)
        for k in cutlass.range(P * N // (threads * CHUNK), unroll=2):
            p, chunk = self._state_vector(q, k, threads)
            h0v = widen(vector(sm.h0[p, None], chunk).load())
            dhv = widen(vector(sm.dh[p, None], chunk).load())
            for e in cutlass.range_constexpr(CHUNK):
                dot = dot + h0v[e] * dhv[e]
        dot = _warp_sum(dot)
        if cute.arch.lane_idx() == 0:
            dst[q // 32] = dot

    @cute.jit
    def _load_states(self, a, t, sm, row, h, blk, s0, s1, rows, tid, io_type: cutlass.Constexpr):
        """The states entering (h₀) and leaving (dh_end) the run [s0, s1) into shared memory in the I/O dtype, and
        each warp's share of their fp32 dot product ⟨dh_end, h₀⟩."""
        P, N = self.columns, self.state_columns
        seq = sm.seq[s0]
        # h₀: the forward's state after the previous block when the run continues a sequence, else the initial one
        h0_valid = Int32(0)
        h0_from_states = Int32(0)
        slot = seq
        if s0 == 0:
            if sm.masks[4] != 0:
                h0_from_states = Int32(1)
                h0_valid = Int32(1)
        if h0_from_states == 0:
            if a.has_initial_states != 0:
                if seq < a.num_seqs:
                    if a.has_initial_state_indices != 0:
                        slot = t.initial_indices[seq]
                    if (slot >= 0) & (slot < a.num_initial_slots):
                        h0_valid = Int32(1)
        # dh_end: the dstates pass's gradient after the block's last row, else the sequence's dfinal_states
        dh_valid = Int32(1)
        dh_from_dstates = Int32(0)
        if s1 == rows:
            dh_from_dstates = Int32(1)
        else:
            if (a.has_dfinal_states == 0) | (seq >= a.num_seqs):
                dh_valid = Int32(0)
        sH0, sDh, s_dot = sm.h0, sm.dh, sm.dot
        # the two states: this thread's vectors (CHUNK consecutive values of a row of each contiguous P × N block,
        # 16-byte loads from the workspace's aligned states, element loads from the callers' arrays) in unrolled
        # batches, so that a batch's loads are in flight together; their fp32 dot product, and their I/O-dtype
        # copies for the products, a 16-byte shared store per vector
        def flat(block):  # (the CTA's part of N of rows d_state apart)
            return cute.make_tensor(block.iterator, cute.make_layout(((N, P),), stride=((1, self.d_state),)))

        h0_src = flat(t.states[row, cute.math.max(blk - 1, Int32(0)), h, None, None])
        initial_src = flat(t.initial[self._state_row(slot, a.num_initial_slots, row), h, None, None])
        dh_src = flat(t.dstates[row, blk, h, None, None])
        dfinal_src = flat(t.dfinal[self._state_row(seq, a.num_seqs, row), h, None, None])
        vectors = min(STATE_BATCH, P * N // THREADS) // CHUNK
        dot = Float32(0.0)
        for part in cutlass.range_constexpr(P * N // (THREADS * CHUNK * vectors)):
            h0v = cute.make_rmem_tensor((CHUNK, vectors), Float32)
            dhv = cute.make_rmem_tensor((CHUNK, vectors), Float32)
            h0v.fill(0.0)
            dhv.fill(0.0)
            if h0_valid != 0:
                if h0_from_states != 0:
                    _gather(h0v, h0_src, part * vectors, tid)
                else:
                    _gather(h0v, initial_src, part * vectors, tid)
            if dh_valid != 0:
                if dh_from_dstates != 0:
                    _gather(dhv, dh_src, part * vectors, tid)
                else:
                    _gather(dhv, dfinal_src, part * vectors, tid)
            for k in cutlass.range_constexpr(vectors):
                p, chunk = self._state_vector(tid, part * vectors + k)
                for e in cutlass.range_constexpr(CHUNK):
                    dot = dot + h0v[e, k] * dhv[e, k]
                vector(sH0[p, None], chunk).store(h0v[None, k].load().to(io_type))
                vector(sDh[p, None], chunk).store(dhv[None, k].load().to(io_type))
        dot = _warp_sum(dot)
        if cute.arch.lane_idx() == 0:
            s_dot[cute.arch.warp_idx()] = dot

    @cute.jit
    def _run(self, a, t, sm, mma, acc_dx, acc_y, row, h, blk, s0, s1, rows, landed_run, tid,
             io_type: cutlass.Constexpr):
        """One sequence run [s0, s1) of the block, its states in shared memory: its entries of S and W (into shared
        memory) with their row and column sums, and the products with the states entering (h₀) and leaving
        (dh_end) it. ``landed_run``: 1 when its states landed from the workspace and side warps take their dot
        product (the row pass then adds its term), else 0."""
        P, N = self.columns, self.state_columns
        zero = Float32(0.0)
        base = zero
        if s0 > 0:
            base = sm.cs[s0 - 1]
        cs_end = sm.cs[s1 - 1]
        s_run_start, s_run_end, s_last = sm.run_start, sm.run_end, sm.last

        per_row = THREADS // TILE
        s = tid // per_row
        part = tid % per_row
        in_run = (s >= s0) & (s < s1)
        cs_s = sm.cs[s]
        w = Float32(cutlass.select_(in_run, cute.math.exp2(cute.math.min(cs_end - cs_s, zero), fastmath=True) * sm.delta[s],
                                    zero))
        e_s = Float32(cutlass.select_(in_run, cute.math.exp2(cute.math.min(cs_s - base, zero), fastmath=True), zero))
        sXw = cute.make_tensor(sm.scaled.iterator, smem_layout((TILE, P)))
        sGe = cute.make_tensor(sm.scaled.iterator + TILE * P, smem_layout((TILE, P)))
        scale_rows([(sm.x, sXw, w), (sm.G, sGe, e_s)], s, part, per_row, io_type)
        if in_run & (part == 0):
            s_run_end[s] = s1
            s_run_start[s] = s0
        fence_operands(mma)
        self._sync()

        if (tid == 0) & (landed_run == 0):
            total = Float32(0.0)
            for wi in cutlass.range_constexpr(WARPS):
                total = total + sm.dot[wi]
            s_last[s1 - 1] = cute.math.exp2(cute.math.min(cs_end - base, zero), fastmath=True) * total

        # the run's entries of S = M Δ_j and V = (Q ⊙ the decay) Δ_j (added to the heads' sum), the column sums of
        # Q ⊙ M, and W = Q ⊙ M Δ_j in place of Q in the parked fragment (each entry belongs to at most one run)
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        parts = sm.part_slots
        coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, TILE))))
        frag = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        cb = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        stored = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        v_sum = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        # C·Bᵀ, the same for every head of the group: a product per run costs less than parking it
        cb.fill(0.0)
        ahead = self.products_ahead
        mma.gemm(cb, sm.C, sm.B, N // 16, wait=not ahead)
        leaving = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P)), Float32)  # B·dh_endᵀ
        if cutlass.const_expr(ahead):
            # (overwritten, not zero-filled: issued ahead, its fill was not always folded into the product by ptxas)
            mma.gemm(leaving, sm.B, sm.dh, N // 16, wait=False, accumulate=False)
            mma.wait(pending=1)
        _unpark(stored, sm.Q[tid, None])
        _unpark(v_sum, sm.V_sum[tid, None])
        F = mn_view(frag)
        CB = mn_view(cb)
        St = mn_view(stored)
        V = mn_view(v_sum)
        S_rows = mn_view(mma.thr.partition_C(sm.S))
        columns = cute.size(F, mode=[1])
        cs_j = cute.make_rmem_tensor((columns,), Float32)
        delta_j = cute.make_rmem_tensor((columns,), Float32)
        for c in cutlass.range_constexpr(columns):
            cs_j[c] = sm.cs[coords[0, c][1]]
            delta_j[c] = sm.delta[coords[0, c][1]]
        s_pair = cute.make_rmem_tensor((2,), io_type)
        for r in cutlass.range_constexpr(cute.size(F, mode=[0])):
            i = coords[r, 0][0]
            cs_i = sm.cs[i]
            row_in = (i >= s0) & (i < s1)
            for n in cutlass.range_constexpr(columns // 2):
                for half in cutlass.range_constexpr(2):
                    c = 2 * n + half
                    j = coords[0, c][1]
                    keep = row_in & (j >= s0) & (j <= i)
                    decay = cute.math.exp2(cute.math.min(cs_i - cs_j[c], zero), fastmath=True)
                    q = St[r, c]
                    m = CB[r, c] * decay
                    F[r, c] = Float32(cutlass.select_(keep, m * q, zero))
                    St[r, c] = Float32(cutlass.select_(keep, m * q * delta_j[c], q))
                    s_pair[half] = Float32(cutlass.select_(keep, m * delta_j[c], zero)).to(io_type)
                    V[r, c] = V[r, c] + Float32(cutlass.select_(keep, q * decay * delta_j[c], zero))
                # a run's row is written whole: its entries outside the run are zero (M is block-diagonal by run)
                if row_in:
                    S_rows[r, (None, n)].store(s_pair.load())
        _column_sums(F, coords, parts[0, warp_id % WARP_ROWS, None], lane)
        _park(stored, sm.Q[tid, None])
        _park(v_sum, sm.V_sum[tid, None])

        # U = 2^(cs_end - cs_j) · B·dh_endᵀ on the run's rows: dx += Δ ⊙ U, row sums of x ⊙ U
        entering = leaving  # C·h₀ᵀ: in B·dh_endᵀ's registers once U is summed, unless issued ahead
        if cutlass.const_expr(ahead):
            entering = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P)), Float32)
            entering.fill(0.0)
            mma.gemm(entering, sm.C, sm.h0, N // 16, wait=False)
            mma.wait(pending=1)
        else:
            leaving.fill(0.0)
            mma.gemm(leaving, sm.B, sm.dh, N // 16)
        T_ = mn_view(leaving)
        dX = mn_view(acc_dx)
        coords_p = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, P))))
        x_rows = mn_view(mma.thr.partition_C(sm.x))  # the thread's (row, column pair) entries of the tiles
        G_rows = mn_view(mma.thr.partition_C(sm.G))
        for r in cutlass.range_constexpr(cute.size(T_, mode=[0])):
            i = coords_p[r, 0][0]
            f = Float32(cutlass.select_((i >= s0) & (i < s1),
                                        cute.math.exp2(cute.math.min(cs_end - sm.cs[i], zero), fastmath=True), zero))
            delta_i = sm.delta[i]
            for n in cutlass.range_constexpr(cute.size(T_, mode=[1]) // 2):
                x_pair = widen(x_rows[r, (None, n)].load())
                for half in cutlass.range_constexpr(2):
                    c = 2 * n + half
                    u = f * T_[r, c]
                    dX[r, c] = dX[r, c] + delta_i * u
                    T_[r, c] = u * x_pair[half]
        _row_sums(T_, coords_p, parts[2, warp_id // WARP_ROWS, None], lane)
        # y0 = e ⊙ C·h₀ᵀ on the run's rows (y's share from the entering state): row sums of G ⊙ y0
        if cutlass.const_expr(ahead):
            mma.wait()
        else:
            entering.fill(0.0)
            mma.gemm(entering, sm.C, sm.h0, N // 16)
        T_ = mn_view(entering)
        Y = mn_view(acc_y)
        for r in cutlass.range_constexpr(cute.size(T_, mode=[0])):
            i = coords_p[r, 0][0]
            f = Float32(cutlass.select_((i >= s0) & (i < s1),
                                        cute.math.exp2(cute.math.min(sm.cs[i] - base, zero), fastmath=True), zero))
            for n in cutlass.range_constexpr(cute.size(T_, mode=[1]) // 2):
                g_pair = widen(G_rows[r, (None, n)].load())
                for half in cutlass.range_constexpr(2):
                    y0 = f * T_[r, 2 * n + half]
                    Y[r, 2 * n + half] = Y[r, 2 * n + half] + y0
                    T_[r, 2 * n + half] = y0 * g_pair[half]
        _row_sums(T_, coords_p, parts[1, warp_id // WARP_ROWS, None], lane)
        # dB += (w ⊙ x)·dh_end ; dC += (e ⊙ G)·h₀
        state_products = [(sm.dB[tid, None], sXw, transposed(sm.dh, P, N)),
                          (sm.dC[tid, None], sGe, transposed(sm.h0, P, N))]
        for group in [state_products] if ahead else [[product] for product in state_products]:
            _accumulate(mma, group, P // 16, b_transposed=True)

    @cute.jit
    def _finish(self, a, t, sm, mma, g2s, acc_dx, acc_y, row, h, has_next, head_dt, blk, block_start, rows, landed,
                tid, io_type: cutlass.Constexpr):
        """The head's products with S, dx, dz, ddt and the partial sums; returns the next head's dt (warp 0, without
        a row warp)."""
        P = self.columns
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        zero = Float32(0.0)
        coords_p = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, P))))
        G_rows = mn_view(mma.thr.partition_C(sm.G))
        parts = sm.part_slots
        fence_operands(mma)
        self._sync()
        factors = None  # (dz's factors, when read here: early_dz_factors; after the proxy fence, whose MEMBAR waits
        # for every load of the thread still in flight)
        if cutlass.const_expr(self.early_dz_factors):
            factors = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, P)), t.dz.element_type)
            if a.has_z != 0:
                self._load_dz_factors(t, mma, factors, row, h, blk, rows)
        if cutlass.const_expr(self.products_ahead):  # (dx's and y's products run during the straddling sums)
            self._dx_product(sm, mma, acc_dx, wait=False)
            self._y_product(sm, mma, acc_y, wait=False)
        raw0, raw1, bias, A_next = _no_head_dt(t)
        if cutlass.const_expr(not self.warp_specialized):
            if warp_id == 0:
                if has_next:
                    raw0, raw1, bias, A_next = self._load_head_dt(a, t, sm, row, h + 1, block_start, lane)
        self._straddling_sums(sm, mma, tid)
        if has_next:  # (the states tile is free again: the next head's states land during this head's last steps)
            self._land_states(t, sm, g2s, row, h + 1, blk, landed, tid)

        # dx = Sᵀ·G + Δ ⊙ U + D ⊙ G (rows inside a sequence, below L)
        dx_out, partials = t.dx, t.partials
        per_row = THREADS // TILE
        s = tid // per_row
        part = tid % per_row
        if cutlass.const_expr(self.products_ahead):
            mma.wait()
        else:
            self._dx_product(sm, mma, acc_dx, wait=True)
        dX = mn_view(acc_dx)
        for r in cutlass.range_constexpr(cute.size(dX, mode=[0])):
            i = coords_p[r, 0][0]
            inside = sm.seq[i] >= 0
            for n in cutlass.range_constexpr(cute.size(dX, mode=[1]) // 2):
                g_pair = widen(G_rows[r, (None, n)].load())
                for half in cutlass.range_constexpr(2):
                    c = 2 * n + half
                    dX[r, c] = Float32(cutlass.select_(inside, dX[r, c] + sm.D[coords_p[0, c][1]] * g_pair[half],
                                                       zero))
        # staged in shared memory, written in 16-byte row vectors after the barrier below
        store_pairs(dX, mn_view(mma.thr.partition_C(sm.dx)), t.dx.element_type)
        if a.has_z != 0:
            self._dz(t, sm, mma, acc_y, factors, row, h, blk, rows)

        self._sync()
        if s < rows:
            copy_row(sm.dx, dx_out[row, block_start + s, h, None], s, part, per_row)
        if cutlass.const_expr(not self.warp_specialized):
            if warp_id == 1:
                self._rows(a, t, sm, parts, row, h, blk, block_start, rows, Int32(0), lane, io_type)
            if tid >= THREADS - P:  # dD: the warps' column sums in warp order
                p = tid - (THREADS - P)
                total = Float32(0.0)
                for w in cutlass.range_constexpr(WARPS):
                    total = total + sm.dD_slices[w, p]
                partials[row, blk, h, p] = total
        return raw0, raw1, bias, A_next

    def _dx_product(self, sm, mma, acc_dx, wait: bool):
        """acc_dx += Sᵀ·G (dx's product with the head's S)."""
        P = self.columns
        mma.gemm(acc_dx, transposed(sm.S, TILE, TILE), transposed(sm.G, TILE, P), TILE // 16,
                 a_transposed=True, b_transposed=True, wait=wait)

    def _y_product(self, sm, mma, acc_y, wait: bool):
        """acc_y += S·x (y's share from the block's own tokens, for dz)."""
        P = self.columns
        mma.gemm(acc_y, sm.S, transposed(sm.x, TILE, P), TILE // 16, b_transposed=True, wait=wait)

    def _dz_entries(self, t, mma, row, h, blk):
        """(coordinates, dz's entries) of the thread's accumulator entries of the head's block of dz."""
        P = self.columns
        coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, P))))
        return coords, mn_view(mma.thr.partition_C(cute.local_tile(t.dz[row, None, h, None], (TILE, P), (blk, 0))))

    @cute.jit
    def _load_dz_factors(self, t, mma, factors, row, h, blk, rows):
        """The thread's entries of dz's factor dout ⊙ silu'(z), as _gate left it in dz (rows below L), into
        ``factors`` (laid out as the product's accumulator)."""
        F = mn_view(factors)
        coords, dz_rows = self._dz_entries(t, mma, row, h, blk)
        for r in cutlass.range_constexpr(cute.size(F, mode=[0])):
            if coords[r, 0][0] < rows:
                for n in cutlass.range_constexpr(cute.size(F, mode=[1]) // 2):
                    F[r, (None, n)].store(dz_rows[r, (None, n)].load())

    @cute.jit
    def _dz(self, t, sm, mma, acc_y, factors, row, h, blk, rows):
        """dz = y ⊙ (dout ⊙ silu'(z)), the factors as _gate left them in dz (already in ``factors`` when
        :attr:`early_dz_factors`), with y = S·x + y0 + D ⊙ x the forward's output before the gate
        (y0, the entering states' share, summed by the runs into acc_y)."""
        if cutlass.const_expr(not self.products_ahead):  # (else issued before the straddling sums)
            self._y_product(sm, mma, acc_y, wait=True)
        Y = mn_view(acc_y)
        coords, dz_rows = self._dz_entries(t, mma, row, h, blk)
        x_rows = mn_view(mma.thr.partition_C(sm.x))
        factor_rows = mn_view(factors) if self.early_dz_factors else dz_rows
        dz_pair = cute.make_rmem_tensor((2,), t.dz.element_type)
        for r in cutlass.range_constexpr(cute.size(Y, mode=[0])):
            if coords[r, 0][0] < rows:
                # the row's x pairs and factors read before its first store: a global read of the factors after a
                # store to dz could not be moved above it, and each would wait its full latency in turn
                loaded = []
                for n in cutlass.range_constexpr(cute.size(Y, mode=[1]) // 2):
                    loaded.append((x_rows[r, (None, n)].load(), factor_rows[r, (None, n)].load()))
                for n in cutlass.range_constexpr(cute.size(Y, mode=[1]) // 2):
                    x_pair = widen(loaded[n][0])
                    factor = widen(loaded[n][1])
                    for half in cutlass.range_constexpr(2):
                        y = Y[r, 2 * n + half] + sm.D[coords[0, 2 * n + half][1]] * x_pair[half]
                        dz_pair[half] = (y * factor[half]).to(t.dz.element_type)
                    dz_rows[r, (None, n)].store(dz_pair.load())

    @cute.jit
    def _dD_columns(self, sm, q, threads: int):
        """Σ_i G_ip x_ip over the block's rows inside a sequence, by ``threads`` threads (q: this one's index among
        them): each takes one 16-byte column chunk of every (threads / chunks)-th row and the warp adds its rows by
        shuffles; returns, in lane c < P / 8 of each warp, the warp's sums of chunk c's 8 columns."""
        P = self.columns
        chunks = P // CHUNK
        groups = threads // chunks
        chunk = q % chunks
        group = q // chunks
        sums = cute.make_rmem_tensor((CHUNK,), Float32)
        sums.fill(0.0)
        for m in cutlass.range(TILE // groups, unroll=2):
            i = m * groups + group
            gv = widen(vector(sm.G[i, None], chunk).load())
            xv = widen(vector(sm.x[i, None], chunk).load())
            inside = sm.seq[i] >= 0
            for e in cutlass.range_constexpr(CHUNK):
                sums[e] = sums[e] + Float32(cutlass.select_(inside, gv[e] * xv[e], Float32(0.0)))
        for level in cutlass.range_constexpr((32 // chunks).bit_length() - 1):  # the warp's lanes of this chunk
            for e in cutlass.range_constexpr(CHUNK):
                sums[e] = sums[e] + cute.arch.shuffle_sync_bfly(sums[e], chunks << level)
        return sums

    @cute.jit
    def _straddling_sums(self, sm, mma, tid):
        """Σ over straddle[k, ·] = Σ_{i >= k > j} W_ij over the pairs of one run: the intra-block share of da_k (d loss /
        d a_k), in quarters of the rows i.
        Summed pair by pair: the row and column sums of W are large and cancel here (the diagonal, and pairs joined
        by runs of Δ = 0, have decay 1), so their difference would lose everything when |Δ·A| is large."""
        if cutlass.const_expr(self.warp_specialized):
            # the side warps done with the head's states tile (W's place), x and G (the next head's loads follow)
            role_sync(SIDE_DONE, THREADS + SIDE_THREADS)
        # W (fp32) over the run's states tile (_w_offset: rows rotated so that no pass below has bank conflicts)
        w_tile = cute.make_tensor(cute.recast_ptr(sm.states.iterator, dtype=Float32), cute.make_layout((TILE * TILE,)))
        coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((TILE, TILE))))
        stored = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, TILE)), Float32)
        _unpark(stored, sm.Q[tid, None])
        St = mn_view(stored)
        pair = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
            i = coords[r, 0][0]
            inside = sm.seq[i] >= 0
            first = sm.run_start[i]
            for n in cutlass.range_constexpr(cute.size(St, mode=[1]) // 2):  # (a thread's columns come in pairs)
                j = coords[0, 2 * n][1]
                for half in cutlass.range_constexpr(2):
                    claimed = inside & (j + half >= first) & (j + half < i)
                    pair[half] = Float32(cutlass.select_(claimed, St[r, 2 * n + half], Float32(0.0)))
                _w_pair(w_tile, i, j).store(pair.load())
        self._sync()
        # row i: exclusive prefix sums along j, a warp's rows scanned side by side (a lane holds columns 2·lane and
        # 2·lane + 1 of each)
        warp_id = cute.arch.warp_idx()
        lane = cute.arch.lane_idx()
        warp_rows = [warp_id * (TILE // WARPS) + k for k in range(TILE // WARPS)]
        pairs = [_w_pair(w_tile, i, 2 * lane).load() for i in warp_rows]
        inclusive = warp_inclusive_scans([p[0] + p[1] for p in pairs], lane)
        for k in cutlass.range_constexpr(TILE // WARPS):
            before = Float32(cutlass.select_(lane == 0, Float32(0.0), cute.arch.shuffle_sync_up(inclusive[k], 1)))
            pair[0] = before
            pair[1] = before + pairs[k][0]
            _w_pair(w_tile, warp_rows[k], 2 * lane).store(pair.load())
        self._sync()
        # column k: the prefixes of rows i >= k, a quarter of the rows per thread (_rows adds the quarters)
        k = tid % TILE
        quarter = tid // TILE
        total = Float32(0.0)
        for m in cutlass.range_constexpr(TILE // QUARTERS):
            i = quarter * (TILE // QUARTERS) + m
            total = total + Float32(cutlass.select_(i >= k, w_tile[_w_offset(i, k)], Float32(0.0)))
        sm.straddle[k, quarter] = total
        self._sync()
        if cutlass.const_expr(self.warp_specialized):
            role_arrive(ROWS_READY, THREADS + 32)

    @cute.jit
    def _rows(self, a, t, sm, parts, row, h, blk, block_start, rows, landed_end, lane, io_type: cutlass.Constexpr):
        """Warp 1 or the row warp: dΛ per row, its suffix sums within each run (da), dΔ, ddt, and the dA / ddt_bias
        partials. ``landed_end``: with side warps, the end of the first run when its states landed (else 0), whose
        entering state's term this pass adds from the dot warps' sums."""
        P = self.columns
        zero = Float32(0.0)
        A = t.A[h]
        landed_term = zero
        if cutlass.const_expr(self.warp_specialized):
            if landed_end > 0:  # (the run starts at row 0: its base cumsum is 0)
                landed_term = (cute.math.exp2(cute.math.min(sm.cs[landed_end - 1], zero), fastmath=True)
                               * (sm.landed_dot[0] + sm.landed_dot[1]))
        # da_k = Σ_{i >= k in the run} dΛ_i, taken term by term: the pairs of W straddling k (``straddle``); the
        # suffix sums of G·y0 and of the entering state's term at the run's last row; and for the leaving state,
        # -q_i + [i = run end - 1] Σ_run q_j (q_j = Δ_j x_j·U_j), whose suffix is the prefix Σ_{j < k in the run} q_j
        dlam = [zero, zero]
        leaving = [zero, zero]
        direct = [zero, zero]
        for half in cutlass.range_constexpr(2):
            i = lane + 32 * half
            sums = [zero] * PARTS
            for q in cutlass.range_constexpr(PARTS):
                for slot in cutlass.range_constexpr(WARP_ROWS if q == 0 else WARP_COLUMNS):
                    sums[q] = sums[q] + parts[q, slot, i]
            delta_i = sm.delta[i]
            # sums: 0 column sums of Q ⊙ M, 1 G·y0, 2 x·U
            last_i = sm.last[i]
            if cutlass.const_expr(self.warp_specialized):
                last_i = last_i + Float32(cutlass.select_(i == landed_end - 1, landed_term, zero))
            dlam[half] = sums[1] + last_i
            leaving[half] = delta_i * sums[2]
            direct[half] = sums[0] + sums[2]
        suffix, suffix_q, ddt_out, partials = sm.suffix, sm.suffix_q, t.ddt, t.partials
        _block_suffix_sums([(dlam, suffix), (leaving, suffix_q)], lane)
        cute.arch.sync_warp()
        dA_part = zero
        bias_part = zero
        for half in cutlass.range_constexpr(2):
            i = lane + 32 * half
            ddt = zero
            if sm.seq[i] >= 0:
                straddle = Float32(0.0)
                for quarter in cutlass.range_constexpr(QUARTERS):
                    straddle = straddle + sm.straddle[i, quarter]
                da = (straddle + (sm.suffix[i] - sm.suffix[sm.run_end[i]])
                      + (sm.suffix_q[sm.run_start[i]] - sm.suffix_q[i]))
                d_delta = direct[half] + A * da
                dA_part = dA_part + sm.delta[i] * da
                ddt = d_delta * sm.slope[i]
                bias_part = bias_part + ddt
            if i < rows:
                ddt = self._add_slices(sm, i, ddt, h)
                if h % self.head_slices == self.head_slices - 1:
                    ddt_out[row, block_start + i, h] = ddt.to(ddt_out.element_type)
        dA_part = _warp_sum(dA_part)
        bias_part = _warp_sum(bias_part)
        if lane == 0:
            dA_part = self._add_slices(sm, TILE, dA_part, h)
            bias_part = self._add_slices(sm, TILE + 1, bias_part, h)
            if h % self.head_slices == self.head_slices - 1:
                partials[row, blk, h, P] = dA_part
                partials[row, blk, h, P + 1] = bias_part

    @cute.jit
    def _add_slices(self, sm, k, value, h):
        """The kernel's head h's ``value`` of a real head's sum (a row's ddt, the dA or ddt_bias partial) plus the
        earlier slices' share, kept at sm.carry[k] for the next slice: the last slice's is the head's (without head
        slices, ``value``). One thread writes and reads carry[k], for every slice in turn."""
        if cutlass.const_expr(self.head_slices > 1):
            carry = sm.carry
            slice_ = h % self.head_slices
            if slice_ > 0:
                value = value + carry[k]
            if slice_ < self.head_slices - 1:
                carry[k] = value
        return value


class Tensors:
    """The global views of a call, by role (a plain holder: passed whole to the helpers)."""

    def __init__(self, **views):
        self.__dict__.update(views)


class Shared:
    """The shared-memory tiles and arrays of the CTA, by role."""

    def __init__(self, storage, P, N, head_slices, dx_type):
        self.B = storage.B.get_tensor(smem_layout((TILE, N)))
        self.C = storage.C.get_tensor(smem_layout((TILE, N)))
        self.x = storage.x.get_tensor(smem_layout((TILE, P)))
        self.G = storage.gated.get_tensor(smem_layout((TILE, P)))
        self.scaled = storage.scaled.get_tensor(cute.make_layout((2 * TILE * P,)))
        self.S = storage.S.get_tensor(smem_layout((TILE, TILE)))
        self.states = storage.states.get_tensor(cute.make_layout((2 * P * N,)))
        self.h0 = cute.make_tensor(self.states.iterator, smem_layout((P, N)))
        self.dh = cute.make_tensor(self.states.iterator + P * N, smem_layout((P, N)))
        self.straddle = storage.straddle.get_tensor(cute.make_layout((TILE, QUARTERS), stride=(1, TILE)))
        self.dD_slices = storage.dD_slices.get_tensor(cute.make_layout((WARPS, P), stride=(P, 1)))
        self.D = storage.D.get_tensor(cute.make_layout((P,)))
        self._per_head = {name: getattr(storage, name).get_tensor(cute.make_layout((2 * TILE,)))
                          for name in ("delta", "cs", "slope")}
        self.last = storage.last.get_tensor(cute.make_layout((TILE,)))
        self.suffix = storage.suffix.get_tensor(cute.make_layout((TILE + 1,)))
        self.suffix_q = storage.suffix_q.get_tensor(cute.make_layout((TILE + 1,)))
        self.parts = storage.parts.get_tensor(cute.make_layout((PARTS * WARP_ROWS * TILE,)))
        # the same as (part, slot, row or column)
        self.part_slots = cute.make_tensor(self.parts.iterator, cute.make_layout((PARTS, WARP_ROWS, TILE),
                                                                                 stride=(WARP_ROWS * TILE, TILE, 1)))
        self.dot = storage.dot.get_tensor(cute.make_layout((WARPS,)))
        self.landed_dot = storage.landed_dot.get_tensor(cute.make_layout((DOT_WARPS,)))
        self.seq = storage.seq.get_tensor(cute.make_layout((TILE,)))
        self.run_start = storage.run_start.get_tensor(cute.make_layout((TILE,)))
        self.run_end = storage.run_end.get_tensor(cute.make_layout((TILE,)))
        self.masks = storage.masks.get_tensor(cute.make_layout((5,)))
        self.Q = storage.Q.get_tensor(_parking(TILE))
        self.V_sum = storage.V_sum.get_tensor(_parking(TILE))
        # the head's dx (in dx's dtype: fp32 shares with d_state_splits), staged over Q (free from the straddling sums
        # to the next head's Q)
        self.dx = cute.make_tensor(cute.recast_ptr(self.Q.iterator, dtype=dx_type), smem_layout((TILE, P)))
        self.dB = storage.dB.get_tensor(_parking(N))
        self.dC = storage.dC.get_tensor(_parking(N))
        if head_slices > 1:
            self.carry = storage.carry.get_tensor(cute.make_layout((TILE + PARTIAL_EXTRA,)))

    def for_head(self, parity):
        """The same arrays, with delta, cs and slope those of a head of this parity (0 or 1)."""
        view = copy.copy(self)
        for name, both in self._per_head.items():
            setattr(view, name, cute.make_tensor(both.iterator + parity * TILE, cute.make_layout((TILE,))))
        return view


def _no_head_dt(t):
    """A head_dt (:meth:`SsdBackwardChunk._load_head_dt`) of zeros, where no head's is loaded."""
    return t.dt.element_type(0.0), t.dt.element_type(0.0), Float32(0.0), Float32(0.0)


def _w_offset(i, j):
    """Where W_ij sits in the straddling sums' fp32 tile: row i rotated by 8·(i mod 4) columns. A half-warp's
    fragment pair stores (4 rows × 8 banks), a warp's pair loads and stores of one row, and a warp's loads of 32
    columns of one row then each fill 32 different banks (a rotation by i cost 4-way conflicts on the stores)."""
    return i * TILE + (j + 8 * (i % 4)) % TILE


def _w_pair(w_tile, i, j):
    """(W_ij, W_i,j+1), j even: one 8-byte vector of the straddling sums' tile."""
    return cute.make_tensor(w_tile.iterator + cute.assume(_w_offset(i, j), divby=2), cute.make_layout((2,)))


def _per_thread(columns):
    """A thread's share of a (TILE, columns) fp32 accumulator, as (vector, vectors)."""
    return (PARK_VECTOR, TILE * columns // THREADS // PARK_VECTOR)


def _per_thread_stride():
    # a thread's vectors THREADS vectors apart: the 16-byte accesses of a warp are then contiguous (no bank conflicts)
    return (1, PARK_VECTOR * THREADS)


def _parking(columns):
    """(thread, its share) of a parked (TILE, columns) fp32 accumulator."""
    return cute.make_layout((THREADS, _per_thread(columns)), stride=(PARK_VECTOR, _per_thread_stride()))


@cute.jit
def _gather(values, src, first, tid):
    """values[:, k] = vector (first + k) · THREADS + tid of ``src`` (CHUNK consecutive values) in fp32: a batch of a
    thread's state values, loaded together (one 16-byte load per vector where ``src`` is known to be aligned)."""
    vectors = cute.zipped_divide(src, (CHUNK,))
    for k in cutlass.range_constexpr(cute.size(values, mode=[1])):
        values[None, k].store(vectors[None, (first + k) * THREADS + tid].load().to(Float32))


@cute.jit
def _zero(tile, tid):
    """A (TILE, TILE) shared tile of 16-bit values set to zero, 16 bytes per store."""
    vectors = cute.zipped_divide(cute.make_tensor(tile.iterator, cute.make_layout((TILE * TILE,))), (CHUNK,))
    zeros = cute.make_rmem_tensor((CHUNK,), tile.element_type)
    zeros.fill(0.0)
    for k in cutlass.range_constexpr(TILE * TILE // CHUNK // THREADS):
        vectors[None, k * THREADS + tid].store(zeros.load())


@cute.jit
def _park(frag, dst):
    """A thread's accumulator fragment into its share of a thread-major shared array, 16 bytes per store."""
    vectors = cute.make_tensor(dst.iterator, cute.flatten(dst.layout))
    vector = cute.make_rmem_tensor((PARK_VECTOR,), Float32)
    for k in cutlass.range_constexpr(cute.size(frag) // PARK_VECTOR):
        for e in cutlass.range_constexpr(PARK_VECTOR):
            vector[e] = frag[k * PARK_VECTOR + e]
        vectors[None, k].store(vector.load())


@cute.jit
def _unpark(frag, src):
    vectors = cute.make_tensor(src.iterator, cute.flatten(src.layout))
    for k in cutlass.range_constexpr(cute.size(frag) // PARK_VECTOR):
        vector = vectors[None, k].load()
        for e in cutlass.range_constexpr(PARK_VECTOR):
            frag[k * PARK_VECTOR + e] = vector[e]


@cute.jit
def _accumulate(mma, products, k_blocks: cutlass.Constexpr, a_transposed: cutlass.Constexpr = False,
                b_transposed: cutlass.Constexpr = False, fresh: cutlass.Constexpr = False):
    """parked += sA·sBᵀ (parked = sA·sBᵀ when ``fresh``) for each (parked, sA, sB) of ``products``: an fp32
    accumulator of shape (TILE, columns of sB) parked in shared memory. The products are issued together, with
    one wait."""
    accs = []
    for parked, sA, sB in products:
        acc = cute.make_rmem_tensor(mma.thr.partition_shape_C((TILE, cute.size(sB, mode=[0]))), Float32)
        if cutlass.const_expr(fresh):
            acc.fill(0.0)
        else:
            _unpark(acc, parked)
        mma.gemm(acc, sA, sB, k_blocks, a_transposed=a_transposed, b_transposed=b_transposed, wait=False)
        accs.append(acc)
    mma.wait()
    for acc, (parked, _, _) in zip(accs, products):
        _park(acc, parked)


@cute.jit
def _block_suffix_sums(sums, lane):
    """A warp, for each (values, dst) of ``sums``: dst[k] = Σ_{i >= k} of a block's 64 row values (rows lane and
    lane + 32 in ``values``), dst[64] = 0. The scans run side by side."""
    reversed_rows = []
    for values, _ in sums:
        reversed_rows += [cute.arch.shuffle_sync(values[1], 31 - lane), cute.arch.shuffle_sync(values[0], 31 - lane)]
    scanned = warp_inclusive_scans(reversed_rows, lane)
    for k in cutlass.range_constexpr(len(sums)):
        dst = sums[k][1]
        upper = scanned[2 * k]
        dst[63 - lane] = upper
        dst[31 - lane] = scanned[2 * k + 1] + cute.arch.shuffle_sync(upper, 31)
        if lane == 0:
            dst[TILE] = Float32(0.0)


@cute.jit
def _warp_sum(value: Float32) -> Float32:
    """The sum over a warp's lanes in a fixed butterfly order (every lane gets it)."""
    for level in cutlass.range_constexpr(5):
        value = value + cute.arch.shuffle_sync_bfly(value, 1 << level)
    return value


@cute.jit
def _row_sums(frag, coords, dst, lane):
    """dst[row] += this warp's sum of the fragment over its columns, for each row the warp holds (the 4 lanes of
    a quad share a row of an MMA accumulator)."""
    for r in cutlass.range_constexpr(cute.size(frag, mode=[0])):
        total = Float32(0.0)
        for c in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            total = total + frag[r, c]
        total = total + cute.arch.shuffle_sync_bfly(total, 1)
        total = total + cute.arch.shuffle_sync_bfly(total, 2)
        if lane % 4 == 0:
            dst[coords[r, 0][0]] = dst[coords[r, 0][0]] + total


@cute.jit
def _column_sums(frag, coords, dst, lane):
    """dst[col] += this warp's sum of the fragment over its rows, for each column the warp holds (lanes with the
    same lane % 4 share the columns of an MMA accumulator)."""
    for c in cutlass.range_constexpr(cute.size(frag, mode=[1])):
        total = Float32(0.0)
        for r in cutlass.range_constexpr(cute.size(frag, mode=[0])):
            total = total + frag[r, c]
        for level in cutlass.range_constexpr(3):
            total = total + cute.arch.shuffle_sync_bfly(total, 4 << level)
        if lane < 4:
            dst[coords[0, c][1]] = dst[coords[0, c][1]] + total
