"""verify: single-token decode and speculative verification on a state pool (update, snapshot, compact replay).

Math (BRIEF §2), per request b, head h and token t, with the state h (P × N) read from slot s = state_indices[b]::

    Δ   = clamp(softplus?(dt[b,t,h] + dt_bias[h]), dt_min, dt_max)        softplus(v) = v if v > 20
    h   = round_to_pool_dtype(h · exp(Δ·A[h]) + (Δ·x[b,t,h,:]) ⊗ B[b,t,g,:])   g = h // (nheads / ngroups)
    y   = h · C[b,t,g,:]  (+ D[h,:] ⊙ x)   ;   out = y · silu(z) if z is given

The state is rounded to the pool's dtype after every token, as if it were stored and reloaded. That makes the
three modes agree bitwise: T one-token calls equal one T-token call, snapshot slots equal the states a
compact replay later folds, whatever the pool dtype. Every product is an explicit fma so the fold and the
main loop compute the same bits.

Modes (a compile-time constant):
- ``update``:   run the T tokens, write the final state back to slot s.
- ``snapshot``: run the T tokens, write the state after token t to slot snapshot_indices[b, t] (if >= 0).
- ``compact``:  fold the first num_accepted[b] pending rows of the slot's window record (raw x, B, dt kept
  per (slot, head)) into slot s in place, run the T new tokens from there, and store them as the new
  pending window. T = 0 only folds (a commit).

Fused pre-conv (``conv_dtype`` not "none"): x, B and C are not inputs but the causal conv1d of the raw xBC rows
(channels [x (H·P) | B (G·N) | C (G·N)], Mamba-2's split) over the slot's conv window, computed exactly as
``conv1d_verify`` computes them and rounded to the I/O dtype as its output would be; the conv pool and the conv
window record are written as ``conv1d_verify`` writes them, so a fused call equals the pair conv1d_verify →
verify bitwise (outputs, both pools, both window records). Each CTA writes the conv state of its head's x
channels once its conv has read them; a group's B and C channels, which every head of the group reads, are written
at its end by the group's last head to arrive (each arrives once its conv has read them) and the conv window count
by the last group (tickets (num_slots, G + 1)), after every reader is done.
In compact mode each pool clamps num_accepted by its own window count, as the pair would.

Rows are padding (outputs zero, nothing read or written) when the slot index is negative or past the pool;
an out-of-range slot, snapshot index or num_accepted (clamped to [0, pending]) is counted in the optional
device counter. One CTA owns one (request, head): its warps split the P rows, each lane holds N/32
contiguous state columns of a row (one vector access; a warp covers the row, so access is coalesced). A small
update or snapshot call (row_splits 2) runs the row passes of a state in two CTAs instead.

Staged rows: a call's token inputs (x, B, C, z, dt; fused: the conv's x, B, C) and compact mode's pending window
rows are copied into shared memory STAGED_ROWS at a time (16-byte cp.async, issued before the state loads, or
element copies when the runtime found an array unaligned for it), and each row's Δ, exp(Δ·A) and silu(z) are
computed there by all threads at once (in compact mode Δ·x too). The sequential part, one token after another,
then reads shared memory only: with each token's loads from global memory in that chain, T = 8 cost 3x a decode
of the same bytes. A decode (update or snapshot with T = 1) stages nothing: each lane reads its own inputs into
registers and computes Δ itself, with no barrier between its loads and its state update.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from kernel_src.abi import bind, cutlass_dtype, f32, i32, ptr, ssm_strides, strides
from kernel_src.conv_window import ConvViews, last_arrival, settle_ticket, stage_rows, take_ticket, walk_channel
from kernel_src.families import expect_constants
from kernel_src.ssm_math import accepted_rows, delta_from_dt, silu

WARP = 32
# State values a lane keeps in registers (rows_per_warp × N / 32) and warps per CTA: larger states take
# several row passes. Measured on the H200 (bench/bench_verify.py, H128 P64 N128): 16 values and 8 warps
# decode batch 64 in 142 µs; 16 × 16 warps took 221 µs and 32 × 8 warps 165 µs (fewer CTAs per SM).
STATE_REGS_PER_LANE = 16
MAX_WARPS = 8
# Rows of token inputs staged in shared memory at once; a fused call computes all of its conv rows at once, so it
# takes at most this many (the runtime refuses more; a longer prefill is conv1d_fwd + ssd_fwd).
STAGED_ROWS = 16
# Dynamic shared memory per CTA with two CTAs on an SM of the H100 / H200 / B200 (228 KiB, 1 KiB reserved per CTA).
SMEM_PER_CTA_AT_TWO = (228 - 2) * 1024 // 2


class StagedRows:
    """A tile of staged rows in shared memory (a trace-time record): ``rows`` (STAGED_ROWS, row_len) in the I/O
    dtype, ``coefs`` (STAGED_ROWS, 2) fp32 Δ and exp(Δ·A), ``gates`` (STAGED_ROWS, P) fp32 silu(z) or None,
    ``scaled`` (STAGED_ROWS, P) fp32 Δ·x or None."""

    def __init__(self, rows, coefs, gates, scaled):
        self.rows, self.coefs, self.gates, self.scaled = rows, coefs, gates, scaled


class Tile:
    """Rows first .. first + count - 1 of a call's rows of ``inputs`` (and dt), held in ``staged`` (a trace-time
    record)."""

    def __init__(self, inputs, dt_input, staged: StagedRows, first, count):
        self.inputs, self.dt_input, self.staged, self.first, self.count = inputs, dt_input, staged, first, count


class Writes:
    """Where a token's results go and whose they are (a trace-time record): the outputs, the pool and the
    snapshot indices; the request, head and slot validity; the lane's rows (``row0`` .. ``row0 + R - 1``, the
    row it finishes) in the current pass."""

    def __init__(self, out, state, snapshots, b, h, valid, row0, row, lane):
        self.out, self.state, self.snapshots = out, state, snapshots
        self.b, self.h, self.valid, self.row0, self.row, self.lane = b, h, valid, row0, row, lane


class Gates:
    """A head's Δ parameters (dt_bias, A, softplus, limits) and whether z gates the output (a trace-time record)."""

    def __init__(self, dt_bias, A, dt_softplus, dt_min, dt_max, has_z):
        self.dt_bias, self.A, self.dt_softplus, self.dt_min, self.dt_max = dt_bias, A, dt_softplus, dt_min, dt_max
        self.has_z = has_z


class Verify:
    family = "verify"
    grid_rule = "heads,batch,row_splits"
    target_arch = None  # set by the build (compile_variant) before compiling
    # the lowest occupancy target the build may fall back to when a variant spills at its own (compile_variant)
    min_ctas_floor = 2
    modes = ("update", "snapshot", "compact")
    headdims = (64, 128)
    d_states = (64, 128, 256)
    io_dtypes = ("bf16", "fp16", "fp32")
    pool_dtypes = ("fp32", "bf16", "fp16")
    conv_dtypes = ("none", "bf16", "fp16", "fp32")

    @staticmethod
    def combination_error(io_dtype: str, conv_dtype: str, **_) -> str | None:
        """The fused conv's pool holds raw inputs: in the I/O dtype or fp32 (bf16 / fp16 I/O only)."""
        if conv_dtype != "none" and (io_dtype == "fp32" or conv_dtype not in (io_dtype, "fp32")):
            return f"a fused conv pool is in the bf16 / fp16 I/O dtype or fp32 ({io_dtype} I/O, {conv_dtype} pool)"
        return None

    def __init__(self, mode: str, headdim: int, d_state: int, io_dtype: str, pool_dtype: str, conv_dtype: str):
        expect_constants(self, mode=mode, headdim=headdim, d_state=d_state, io_dtype=io_dtype, pool_dtype=pool_dtype,
                         conv_dtype=conv_dtype)
        self.mode, self.headdim, self.d_state = mode, headdim, d_state
        self.io_dtype, self.pool_dtype, self.conv_dtype = io_dtype, pool_dtype, conv_dtype
        self.fused = conv_dtype != "none"
        self.cols_per_lane = d_state // WARP
        # compact runs at 2 CTAs per SM anyway (its fold needs the registers), so up to N = 128 it holds twice
        # the state per lane and saves a row pass (not when fused: that spills): T = 8 at batch 64 went from 885
        # to 640 µs (update and snapshot would spill under their 3-CTA cap, and so does compact with N = 256 on
        # sm_100a)
        doubled = mode == "compact" and self.cols_per_lane <= 4 and not self.fused
        state_regs = 2 * STATE_REGS_PER_LANE if doubled else STATE_REGS_PER_LANE
        self.num_warps = min(MAX_WARPS, max(4, headdim * self.cols_per_lane // state_regs))
        rows_per_lane = headdim // self.num_warps
        self.row_passes = max(1, rows_per_lane * self.cols_per_lane // state_regs)
        self.rows_per_warp = rows_per_lane // self.row_passes
        self.row_bits = self.rows_per_warp.bit_length() - 1  # log2: rows_per_warp is a power of two
        # A one-token update or snapshot call (decode) reads its inputs straight into registers: no staging and
        # no barrier between its loads and its state update, whose latency is most of a small call's time
        self.decodes = mode != "compact" and not self.fused
        # The same calls, update and snapshot unfused, may split a state's row passes over CTAs (grid z): in compact
        # and fused calls a later pass reads what the last one writes (the window rows, the staged conv rows)
        self.splittable = self.decodes and self.row_passes > 1
        self.block = (self.num_warps * WARP, 1, 1)
        # 3 CTAs per SM cap a thread at 80 registers; the compact fold and lanes with 8 columns (N = 256: twice
        # the B and C values in flight) need more and get 2. So do, as the build's spill check found them (the
        # next tile's staging addresses are live across the token loop, a decode's inputs across the state
        # loads), lanes with 8 rows (N = 64), snapshots rounded to a 16-bit pool, and fp32 I/O from P64 N128.
        # The fused conv's update and snapshot fit 80 registers (a variant that spills there is built at 2:
        # min_ctas_floor); what keeps them slower than the pair is not occupancy (docs/PERF_NOTES.md).
        tight_snapshots = mode == "snapshot" and pool_dtype != "fp32"
        wide_io = io_dtype == "fp32" and headdim * d_state >= 64 * 128
        wide = (mode == "compact" or self.cols_per_lane > 4 or self.rows_per_warp >= 8 or tight_snapshots
                or wide_io)
        self.min_ctas_per_sm = 2 if wide else 3
        # a lane's columns are one vector access: the runtime checks the pool's base alignment (bytes)
        self.state_align = min(16, self.cols_per_lane * {"fp32": 4, "bf16": 2, "fp16": 2}[pool_dtype])
        self.cluster = (1, 1, 1)
        # A staged row: [x (P) | B (N) | C (N) | z (P) | dt, padded to one 16-byte vector]; fused, x, B and C are
        # the conv's outputs. Compact mode stages its pending window rows too ([x | B | . | . | dt]).
        io_bytes = {"fp32": 4, "bf16": 2, "fp16": 2}[io_dtype]
        self.chunk = 16 // io_bytes
        self.conv_row = headdim + 2 * d_state
        self.z_col = self.conv_row
        self.dt_col = self.z_col + headdim
        self.row_len = self.dt_col + self.chunk
        # shared memory: the token tile (rows, Δ and decay, silu(z) per row of P), compact mode's pending-row
        # tile (rows, Δ and decay), the fused call's ticket flag (each a multiple of 16 bytes)
        rows_bytes, coefs_bytes = STAGED_ROWS * self.row_len * io_bytes, STAGED_ROWS * 2 * 4
        tokens_bytes = rows_bytes + coefs_bytes + STAGED_ROWS * headdim * 4
        pending_bytes = rows_bytes + coefs_bytes if mode == "compact" else 0
        self.dynamic_smem = tokens_bytes + pending_bytes + (16 if self.fused else 0)
        # compact mode's tiles also hold Δ·x (fp32, computed with the tile's coefficients): its fold and token
        # loop, most of its time, then skip a conversion and a product per row (T = 8 at batch 64: 334 -> 323 µs;
        # update and snapshot, at 80 registers, spilled holding them), unless two CTAs would no longer fit an SM
        scaled_bytes = 2 * STAGED_ROWS * headdim * 4
        self.scaled_x = mode == "compact" and self.dynamic_smem + scaled_bytes <= SMEM_PER_CTA_AT_TWO
        if self.scaled_x:
            self.dynamic_smem += scaled_bytes

    def params(self):
        io, pool = self.io_dtype, self.pool_dtype
        return [
            ptr("state", pool, align=self.state_align), ptr("x", io), ptr("dt", io), ptr("A", "fp32"),
            ptr("B", io), ptr("C", io),
            ptr("D", "fp32"), ptr("z", io), ptr("dt_bias", "fp32"), ptr("out", io),
            ptr("state_indices", "int32"), ptr("snapshot_indices", "int32"), ptr("num_accepted", "int32"),
            ptr("window_count", "int32"), ptr("window_x", io), ptr("window_B", io), ptr("window_dt", io),
            ptr("rejected", "int32"),
            i32("batch"), i32("seqlen"), i32("nheads"), i32("heads_per_group"), i32("num_slots"),
            i32("window_capacity"),
            *strides("state", "slot", "head"), *ssm_strides(),
            *strides("state_indices", "batch"), *strides("snapshot_indices", "batch", "seqlen"),
            *strides("num_accepted", "batch"), *strides("window_count", "slot", "head"),
            *strides("window_x", "slot", "row", "head"), *strides("window_B", "slot", "row", "head"),
            *strides("window_dt", "slot", "row", "head"),
            i32("has_D"), i32("has_z"), i32("has_dt_bias"), i32("dt_softplus"), i32("has_rejected"), i32("vector_rows"),
            i32("row_splits"),
            f32("dt_min"), f32("dt_max"),
            # the fused pre-conv (null and zero in unfused variants)
            ptr("conv_state", io if not self.fused else self.conv_dtype), ptr("xBC", io), ptr("conv_weight", "fp32"),
            ptr("conv_bias", "fp32"), ptr("conv_window_count", "int32"), ptr("conv_window_xBC", io),
            ptr("tickets", "int32"), i32("channels"), i32("width"),
            *strides("conv_state", "slot", "channel", "tap"), *strides("xBC", "batch", "seqlen", "channel"),
            *strides("conv_weight", "channel", "tap"), *strides("conv_bias", "channel"),
            *strides("conv_window_count", "slot"), *strides("conv_window_xBC", "slot", "row", "channel"),
            *strides("tickets", "slot", "group"), i32("has_conv_bias"), i32("silu"),
        ]

    @cute.jit
    def __call__(self, args: tuple, stream):
        a = bind(self.params(), args)
        # An explicit occupancy target (min_ctas_per_sm): ptxas' own target spilled, and 3 CTAs of 256 threads
        # per SM keep enough state loads in flight (sm_90a, measured; where another arch's allocation spills at
        # 3, the build falls back to 2). The carveout is given only so that the DSL does not ask a device for its
        # shared memory size; it sets nothing in the cubin.
        self.kernel(args).launch(grid=[a.nheads, a.batch, a.row_splits], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream, min_blocks_per_mp=self.min_ctas_per_sm,
                                 preferred_smem_carveout=0)

    @cute.kernel
    def kernel(self, args: tuple):
        a = bind(self.params(), args)
        P, N, R, V = self.headdim, self.d_state, self.rows_per_warp, self.cols_per_lane
        io_type, pool_type = cutlass_dtype(self.io_dtype), cutlass_dtype(self.pool_dtype)
        compact = self.mode == "compact"
        h, b, split = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        g = h // a.heads_per_group

        # Int64 strides make every offset 64-bit. Each (slot, head) state block is a contiguous P × N matrix and
        # the innermost dim of x, B, C, z, out and the window is contiguous: per-element offsets are then
        # compile-time constants folded into the load and store instructions, which keeps registers for state.
        def view(pointer, shape, *strides):
            return cute.make_tensor(pointer, cute.make_layout(shape, stride=strides))

        def rows_view(pointer, shape, *strides):
            """A (outer, row, inner, columns) array and its 16-byte view: the same memory with a 16-byte aligned
            base and strides in whole vectors, read only when the runtime found them so (``vector_rows``)."""
            aligned = cute.make_ptr(io_type, pointer.toint(), cute.AddressSpace.gmem, assumed_align=16)
            vectors = [cute.assume(s, divby=self.chunk) for s in strides]
            return view(pointer, shape, *strides, 1), view(aligned, shape, *vectors, 1)

        T, H, cap = a.seqlen, a.nheads, a.window_capacity
        # The runtime checks the pool's base is 16-byte aligned and its slot and head strides are multiples
        # of N / 32 elements, so each lane's N / 32 columns are one aligned vector access.
        V_align = self.cols_per_lane
        state = view(a.state, (a.num_slots, H, P, N), cute.assume(a.stride_state_slot, divby=V_align),
                     cute.assume(a.stride_state_head, divby=V_align), N, 1)
        x = rows_view(a.x, (a.batch, T, H, P), a.stride_x_batch, a.stride_x_seqlen, a.stride_x_head)
        dt = view(a.dt, (a.batch, T, H), a.stride_dt_batch, a.stride_dt_seqlen, a.stride_dt_head)
        Bm = rows_view(a.B, (a.batch, T, H, N), a.stride_B_batch, a.stride_B_seqlen, a.stride_B_group)
        Cm = rows_view(a.C, (a.batch, T, H, N), a.stride_C_batch, a.stride_C_seqlen, a.stride_C_group)
        D = view(a.D, (H, P), a.stride_D_head, a.stride_D_dim)
        z = rows_view(a.z, (a.batch, T, H, P), a.stride_z_batch, a.stride_z_seqlen, a.stride_z_head)
        out = view(a.out, (a.batch, T, H, P), a.stride_out_batch, a.stride_out_seqlen, a.stride_out_head, 1)
        snapshots = view(a.snapshot_indices, (a.batch, T), a.stride_snapshot_indices_batch,
                         a.stride_snapshot_indices_seqlen)
        w_count = view(a.window_count, (a.num_slots, H), a.stride_window_count_slot, a.stride_window_count_head)
        w_x = rows_view(a.window_x, (a.num_slots, cap, H, P), a.stride_window_x_slot, a.stride_window_x_row,
                        a.stride_window_x_head)
        w_B = rows_view(a.window_B, (a.num_slots, cap, H, N), a.stride_window_B_slot, a.stride_window_B_row,
                        a.stride_window_B_head)
        w_dt = view(a.window_dt, (a.num_slots, cap, H), a.stride_window_dt_slot, a.stride_window_dt_row,
                    a.stride_window_dt_head)

        A_h = view(a.A, (H,), a.stride_A_head)[h]
        smem = cutlass.utils.SmemAllocator()
        staged_layout = cute.make_layout((STAGED_ROWS, self.row_len), stride=(self.row_len, 1))
        # per staged row: its Δ and exp(Δ·A) (and for tokens silu(z) per row of P), computed once per tile by
        # all threads, off the sequential chain of the state update
        coef_layout = cute.make_layout((STAGED_ROWS, 2), stride=(2, 1))
        per_p = cute.make_layout((STAGED_ROWS, P), stride=(P, 1))
        tokens = StagedRows(smem.allocate_tensor(io_type, staged_layout, 16),
                            smem.allocate_tensor(Float32, coef_layout, 16), smem.allocate_tensor(Float32, per_p, 16),
                            smem.allocate_tensor(Float32, per_p, 16) if self.scaled_x else None)
        pending = None
        if cutlass.const_expr(compact):
            pending = StagedRows(smem.allocate_tensor(io_type, staged_layout, 16),
                                 smem.allocate_tensor(Float32, coef_layout, 16), None,
                                 smem.allocate_tensor(Float32, per_p, 16))
        cv = None
        if cutlass.const_expr(self.fused):
            K = a.width
            cv = ConvViews(
                pool=view(a.conv_state, (a.num_slots, a.channels, K - 1), a.stride_conv_state_slot,
                          a.stride_conv_state_channel, a.stride_conv_state_tap),
                xBC=view(a.xBC, (a.batch, T, a.channels), a.stride_xBC_batch, a.stride_xBC_seqlen,
                         a.stride_xBC_channel),
                weight=view(a.conv_weight, (a.channels, K), a.stride_conv_weight_channel, a.stride_conv_weight_tap),
                bias=view(a.conv_bias, (a.channels,), a.stride_conv_bias_channel), has_bias=a.has_conv_bias,
                width=K, apply_silu=a.silu, num_slots=a.num_slots, snapshots=snapshots,
                rows=view(a.conv_window_xBC, (a.num_slots, cap, a.channels), a.stride_conv_window_xBC_slot,
                          a.stride_conv_window_xBC_row, a.stride_conv_window_xBC_channel) if compact else None)
            flag = smem.allocate_tensor(Int32, cute.make_layout((1,)), 16)   # the tickets'

        # What the staged rows hold: (column, arrays, outer index, inner index, enabled) per input, then dt.
        # A fused call's x, B and C are its conv outputs, computed into the same columns.
        token_inputs = ((self.z_col, z, b, h, a.has_z),)
        if cutlass.const_expr(not self.fused):
            token_inputs = ((0, x, b, h, 1), (P, Bm, b, g, 1), (P + N, Cm, b, g, 1)) + token_inputs
        one_token = Int32(0)
        if cutlass.const_expr(self.decodes):
            if T == 1:
                one_token = Int32(1)
        # The slot index is read first (the state load waits on it); the first tiles' copies are in flight while
        # it and the state load.
        slot = view(a.state_indices, (a.batch,), a.stride_state_indices_batch)[b]
        if one_token == 0:
            self._stage(token_inputs, (dt, b, h), tokens.rows, 0, cute.math.min(T, STAGED_ROWS), a.vector_rows,
                        tid)
        cute.arch.cp_async_commit_group()
        cur_x, cur_B, cur_C = self._token_buffers(io_type)

        valid = Int32(0)
        if slot >= 0:
            if slot < a.num_slots:
                valid = Int32(1)
            else:
                self._count(a, h, tid)
        folds = Int32(0)
        conv_folds = Int32(0)   # the conv's own clamp (by its window count), as conv1d_verify's in the pair
        if cutlass.const_expr(compact):
            if valid != 0:
                accepted = view(a.num_accepted, (a.batch,), a.stride_num_accepted_batch)[b]
                folds = accepted_rows(accepted, w_count[slot, h], cap)
                if folds != accepted:
                    self._count(a, h, tid)
                if cutlass.const_expr(self.fused):
                    conv_count = view(a.conv_window_count, (a.num_slots,), a.stride_conv_window_count_slot)[slot]
                    conv_folds = accepted_rows(accepted, conv_count, cap)

        fold_inputs = ((0, w_x, slot, h, 1), (P, w_B, slot, h, 1))
        if cutlass.const_expr(compact):
            self._stage(fold_inputs, (w_dt, slot, h), pending.rows, 0, cute.math.min(folds, STAGED_ROWS),
                        a.vector_rows, tid)
            cute.arch.cp_async_commit_group()
        bias = Float32(0.0)
        if a.has_dt_bias != 0:
            bias = view(a.dt_bias, (H,), a.stride_dt_bias_head)[h]
        gates = Gates(bias, A_h, a.dt_softplus, a.dt_min, a.dt_max, a.has_z)

        st = cute.make_rmem_tensor((R, V), Float32)
        sums = cute.make_rmem_tensor((R,), Float32)

        # A small update or snapshot call may run its passes in CTAs of their own (grid z: the runtime's
        # row_splits): CTA z runs passes z, z + row_splits, ... A CTA past the passes has nothing to do, and so has
        # any CTA but the first of a call that cannot split (the runtime launches none).
        first_pass, splits = split * self.row_passes, Int32(1)
        if cutlass.const_expr(self.splittable):
            first_pass, splits = split, a.row_splits
        # The first tiles of every pass: the token rows and, in compact mode, the pending window's rows.
        first_tiles = (Tile(token_inputs, (dt, b, h), tokens, 0, cute.math.min(T, STAGED_ROWS)),)
        if cutlass.const_expr(compact):
            first_tiles += (Tile(fold_inputs, (w_dt, slot, h), pending, 0, cute.math.min(folds, STAGED_ROWS)),)

        arrival = Int32(0)   # a fused call's arrival at its group's ticket (take_ticket)
        # Large states are processed in row passes so that each lane keeps at most R × V values. ``nth`` counts
        # this CTA's passes (a trace-time constant: its first finds the first tiles staged, a later one may not).
        for nth in cutlass.range_constexpr(self.row_passes):
            row_pass = first_pass + nth * splits
            if row_pass < self.row_passes:
                last_pass = nth == self.row_passes - 1   # (compact: never split)
                # Each lane finishes one row: the row totals land on lanes (row - row0) * 32 / R and up.
                row0 = (row_pass * self.num_warps + warp) * R
                row = row0 + (lane >> (5 - self.row_bits))
                dt_now, x_now, z_now = Float32(0.0), Float32(0.0), Float32(0.0)
                if cutlass.const_expr(self.decodes):
                    if one_token != 0:   # a decode's inputs, in flight with the state loads
                        dt_now = dt[b, 0, h].to(Float32)
                        self._read_columns((Bm[0][b, 0, g, None], 0), (Cm[0][b, 0, g, None], 0), lane, cur_B, cur_C)
                        x_now, z_now = self._read_rows(x[0], z[0], a.has_z, b, h, row0, row, cur_x)
                for r in cutlass.range_constexpr(R):
                    for j in cutlass.range_constexpr(V):
                        st[r, j] = Float32(0.0)
                if valid != 0:
                    self._load_state(state, slot, h, row0, lane, st, pool_type)
                D_row = Float32(0.0)
                if a.has_D != 0:   # loaded here, off the chain of the token loop
                    D_row = D[h, row]
                writes = Writes(out, state, snapshots, b, h, valid, row0, row, lane)
                if cutlass.const_expr(self.fused and nth == 0):
                    # every row's conv outputs, while the first state loads are in flight; every pass reads them
                    self._stage_conv(a, cv, tokens.rows, b, slot, valid, conv_folds, h, g, tid, io_type)
                    if valid != 0:   # (the group's B and C windows are read: the arrival's trip overlaps the passes)
                        arrival = take_ticket(self._ticket(a, slot, g), tid)
                        self._write_head_channels(a, cv, b, slot, conv_folds, h, tid)
                # The first tiles are made ready at once (one wait and two barriers for both); a later pass finds
                # them still there unless the call has more rows than a tile (then the loops below stage them).
                if cutlass.const_expr(nth == 0):
                    if one_token == 0:
                        self._ready(first_tiles, gates, False, a.vector_rows, tid)

                if cutlass.const_expr(compact):
                    for f0 in range(0, folds, STAGED_ROWS):
                        rows = cute.math.min(folds - f0, STAGED_ROWS)
                        if self._restage(f0, folds, nth):
                            self._ready((Tile(fold_inputs, (w_dt, slot, h), pending, f0, rows),), gates, True,
                                        a.vector_rows, tid)
                        for i in range(rows):
                            self._read_row(pending, i, row0, lane, cur_x, cur_B, None)
                            self._advance(st, pending.coefs[i, 0], pending.coefs[i, 1], cur_x, cur_B, pool_type)
                    if folds > 0:
                        self._store_state(state, slot, h, row0, lane, st, pool_type)
                    # (every warp's reads of the old window precede any write of the new one: each fold tile's
                    # copies completed before the barrier that made it ready)

                # Padding rows run the token loop too (from a zero state, on their own inputs) so that the warp
                # shuffles stay in uniform control flow; only the writes depend on the row being valid.
                if cutlass.const_expr(self.decodes):
                    if one_token != 0:
                        # the functions _prepare_coefs and _prepare_columns apply, on the same values: a decode
                        # equals a token of a longer call bitwise
                        delta = delta_from_dt(dt_now, bias, a.dt_softplus, a.dt_min, a.dt_max)
                        now = cute.make_rmem_tensor((2,), Float32)   # the row's x and z gate
                        now[0] = x_now
                        if a.has_z != 0:
                            now[1] = silu(z_now)
                        self._token(a, writes, st, sums, (cur_x, cur_B, cur_C), (delta, cute.math.exp(delta * A_h)),
                                    (now, 0), (now, 1), D_row, 0, nth, tid)
                for t0 in range(0, T * (1 - one_token), STAGED_ROWS):
                    rows = cute.math.min(T - t0, STAGED_ROWS)
                    if self._restage(t0, T, nth):
                        self._ready((Tile(token_inputs, (dt, b, h), tokens, t0, rows),), gates, True, a.vector_rows,
                                    tid)
                    # (ptxas cannot prove the warp converged after the conditional code before a tile, and then
                    # guards every shuffle below with a divergent fallback: 40 more instructions a token)
                    cute.arch.sync_warp()
                    for i in range(rows):
                        self._read_row(tokens, i, row0, lane, cur_x, cur_B, cur_C)
                        self._token(a, writes, st, sums, (cur_x, cur_B, cur_C),
                                    (tokens.coefs[i, 0], tokens.coefs[i, 1]), (tokens.rows[i, None], row),
                                    (tokens.gates[i, None], row), D_row, t0 + i, nth, tid)
                    if cutlass.const_expr(compact and last_pass):
                        if valid != 0:
                            # the tile's rows become the new pending window, now that every pass has folded the
                            # old one: x, B and dt straight from the staged rows
                            self._stage(fold_inputs, (w_dt, slot, h), tokens.rows, t0, rows, a.vector_rows, tid,
                                        back=True)

                if cutlass.const_expr(self.mode == "update"):
                    if valid != 0:
                        self._store_state(state, slot, h, row0, lane, st, pool_type)

        if cutlass.const_expr(compact):
            if valid != 0 and split == 0:
                if tid == 0:
                    w_count[slot, h] = T
        if cutlass.const_expr(self.fused):
            if valid != 0 and split == 0:
                self._conv_bookkeeping(a, cv, flag, b, slot, conv_folds, g, arrival, tid)

    def _token_buffers(self, io_type):
        """Registers for one token's inputs: x (R; Δ·x in fp32 when the tiles hold it), B (V), C (V)."""
        R, V = self.rows_per_warp, self.cols_per_lane
        x_type = Float32 if self.scaled_x else io_type
        return tuple(cute.make_rmem_tensor((n,), t) for n, t in ((R, x_type), (V, io_type), (V, io_type)))

    @cute.jit
    def _stage(self, inputs, dt_input, staged, first: Int32, count: Int32, vector: Int32, tid: Int32,
               back: cutlass.Constexpr = False):
        """Rows first .. first + count - 1 of each input into ``staged`` rows 0 .. count - 1 at the input's
        column, and dt at ``dt_col`` (``back``: the other way, staged rows into the arrays). 16-byte vectors
        (loads by cp.async, committed by the caller) when the runtime found every row array 16-byte aligned with
        whole-vector strides, else element copies. One row of an input is ``array[outer, first + i, inner, :]``."""
        chunk, threads = self.chunk, self.num_warps * WARP
        widths = [cute.size(arrays[0], mode=[3]) for _, arrays, _, _, _ in inputs]
        per_row = sum(widths) // chunk
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), staged.element_type,
                                  num_bits_per_copy=128)
        for c in cutlass.range(tid, count * per_row, threads, unroll=1):
            i = c // per_row
            k = c - i * per_row    # the row's k-th vector, over the inputs in order
            start = 0
            for (column, (plain, vectors), outer, inner, enabled), width in zip(inputs, widths):
                if k >= start and k < start + width // chunk and enabled != 0:
                    e = k - start
                    shared = cute.zipped_divide(staged[i, None], (chunk,))[None, column // chunk + e]
                    if vector != 0:
                        rows = cute.zipped_divide(vectors[outer, first + i, inner, None], (chunk,))[None, e]
                        if cutlass.const_expr(back):
                            cute.autovec_copy(shared, rows)
                        else:
                            cute.copy(g2s, rows, shared)
                    else:
                        rows = cute.zipped_divide(plain[outer, first + i, inner, None], (chunk,))[None, e]
                        for q in cutlass.range_constexpr(chunk):
                            if cutlass.const_expr(back):
                                rows[q] = shared[q]
                            else:
                                shared[q] = rows[q]
                start += width // chunk
        dt_array, outer, inner = dt_input
        for i in cutlass.range(tid, count, threads, unroll=1):
            if cutlass.const_expr(back):
                dt_array[outer, first + i, inner] = staged[i, self.dt_col]
            else:
                staged[i, self.dt_col] = dt_array[outer, first + i, inner]

    @cute.jit
    def _restage(self, first: Int32, total: Int32, nth: cutlass.Constexpr):
        """Whether the tile of rows from ``first`` must be staged (again) in this CTA's ``nth`` pass: a later tile,
        or in a later pass the first one when later tiles took its place."""
        restage = first > 0
        if cutlass.const_expr(nth > 0):
            restage = restage or total > STAGED_ROWS
        return restage

    @cute.jit
    def _ready(self, tiles, gates: "Gates", restage: cutlass.Constexpr, vector: Int32, tid: Int32):
        """Make ``tiles`` ready to read: staged now when ``restage`` (after every warp is done with the rows there
        before), else already in flight (copied before the state loads; a fused call's conv rows computed since);
        then each row's Δ and decay, and per (row, p) the z gates and, when the tiles hold it, Δ·x."""
        # (the barrier also keeps the state loads issued before it ahead of the wait: without it ptxas scheduled
        # the wait first, and compact's token loop waited out the state loads, 15 % slower at batch 64)
        cute.arch.sync_threads()
        if cutlass.const_expr(restage):
            for tile in tiles:
                self._stage(tile.inputs, tile.dt_input, tile.staged.rows, tile.first, tile.count, vector, tid)
            cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        for tile in tiles:
            self._prepare_coefs(tile.staged, gates, tile.count, tid)
        if cutlass.const_expr(self.scaled_x):
            cute.arch.sync_threads()   # Δ·x reads the Δ just computed
        for tile in tiles:
            self._prepare_columns(tile.staged, gates, tile.count, tid)
        cute.arch.sync_threads()

    @cute.jit
    def _prepare_coefs(self, staged: "StagedRows", gates: "Gates", count: Int32, tid: Int32):
        """Δ = clamp(softplus?(dt + dt_bias)) and exp(Δ·A) of each staged row: the same functions on the same values
        wherever a row is computed (fold, token loop, a decode, another call), so the modes agree bitwise."""
        threads = self.num_warps * WARP
        rows, coefs = staged.rows, staged.coefs   # written through locals (DSL loops)
        for i in cutlass.range(tid, count, threads, unroll=1):
            delta = delta_from_dt(rows[i, self.dt_col].to(Float32), gates.dt_bias, gates.dt_softplus, gates.dt_min,
                                  gates.dt_max)
            coefs[i, 0] = delta
            coefs[i, 1] = cute.math.exp(delta * gates.A)

    @cute.jit
    def _prepare_columns(self, staged: "StagedRows", gates: "Gates", count: Int32, tid: Int32):
        """Per (row, p) of the staged rows: silu(z) when the rows carry z, and Δ·x when the tile holds it (the
        product _advance would form, the same bits)."""
        threads, P = self.num_warps * WARP, self.headdim
        rows, coefs, z_gates, scaled = staged.rows, staged.coefs, staged.gates, staged.scaled
        if cutlass.const_expr(z_gates is not None):
            if gates.has_z != 0:
                for e in cutlass.range(tid, count * P, threads, unroll=1):
                    i = e // P
                    z_gates[i, e - i * P] = silu(rows[i, self.z_col + e - i * P].to(Float32))
        if cutlass.const_expr(scaled is not None):
            for e in cutlass.range(tid, count * P, threads, unroll=1):
                i = e // P
                scaled[i, e - i * P] = coefs[i, 0] * rows[i, e - i * P].to(Float32)

    @cute.jit
    def _token(self, a, writes: "Writes", st, sums, values, coefs, x_at, gate_at, D_row: Float32, t: Int32,
               nth: cutlass.Constexpr, tid: Int32):
        """Token t (in this CTA's ``nth`` pass): advance the state by this lane's ``values`` (x rows, B and C
        columns) with ``coefs`` (Δ, exp(Δ·A)), finish the output of the lane's row (its x and z gate read from
        (tensor, index) ``x_at`` and ``gate_at`` once the sums are done, which keeps them out of registers until
        then) and write it; in snapshot mode store the state. Shared by a decode and the token loop, so both
        compute the same bits."""
        R, V = self.rows_per_warp, self.cols_per_lane
        pool_type, io_type = cutlass_dtype(self.pool_dtype), cutlass_dtype(self.io_dtype)
        out, state, snapshots = writes.out, writes.state, writes.snapshots   # written through locals (DSL ifs)
        b, h, valid, row0, row, lane = writes.b, writes.h, writes.valid, writes.row0, writes.row, writes.lane
        x_buf, B_buf, C_buf = values
        self._advance(st, coefs[0], coefs[1], x_buf, B_buf, pool_type)
        for r in cutlass.range_constexpr(R):
            sums[r] = Float32(0.0)
            for j in cutlass.range_constexpr(V):
                sums[r] = cute.math.fma(st[r, j], C_buf[j].to(Float32), sums[r])
        y = self._reduce_rows(sums, lane)
        if a.has_D != 0:
            y = cute.math.fma(D_row, x_at[0][x_at[1]].to(Float32), y)
        if a.has_z != 0:
            y = y * gate_at[0][gate_at[1]]
        if valid == 0:
            y = Float32(0.0)
        if lane % (WARP // R) == 0:
            out[b, t, h, row] = y.to(io_type)
        if valid != 0:
            if cutlass.const_expr(self.mode == "snapshot"):
                target = snapshots[b, t]
                if cutlass.const_expr(nth == 0):
                    if target >= a.num_slots:
                        self._count(a, h, tid)
                if target >= 0:
                    if target < a.num_slots:
                        self._store_state(state, target, h, row0, lane, st, pool_type)

    @cute.jit
    def _read_rows(self, x, z, has_z: Int32, b, h, row0, row, x_buf):
        """A decode's x of this lane's rows (``row0`` ..) into ``x_buf``, and the x and z (zero without z) of the
        row it finishes, in fp32."""
        for r in cutlass.range_constexpr(self.rows_per_warp):
            x_buf[r] = x[b, 0, h, row0 + r]
        z_row = Float32(0.0)
        if has_z != 0:
            z_row = z[b, 0, h, row].to(Float32)
        return x[b, 0, h, row].to(Float32), z_row

    @cute.jit
    def _read_columns(self, B_at, C_at, lane, B_buf, C_buf):
        """This lane's B (and C, unless ``C_at`` is None) columns of a token into registers: each given as (a row,
        the column where its N values start)."""
        V = self.cols_per_lane
        for j in cutlass.range_constexpr(V):
            B_buf[j] = B_at[0][B_at[1] + lane * V + j]
            if cutlass.const_expr(C_at is not None):
                C_buf[j] = C_at[0][C_at[1] + lane * V + j]

    @cute.jit
    def _read_row(self, tile: "StagedRows", i: Int32, row0, lane, x_buf, B_buf, C_buf):
        """Staged row i's x (or Δ·x, when the tile holds it) for this lane's rows and its B (and C) columns of
        this lane, into registers."""
        P, N = self.headdim, self.d_state
        staged, scaled = tile.rows[i, None], tile.scaled
        for r in cutlass.range_constexpr(self.rows_per_warp):
            if cutlass.const_expr(self.scaled_x):
                x_buf[r] = scaled[i, row0 + r]
            else:
                x_buf[r] = staged[row0 + r]
        self._read_columns((staged, P), (staged, P + N) if C_buf is not None else None, lane, B_buf, C_buf)

    @cute.jit
    def _stage_conv(self, a, cv, sConv, b, slot, valid, folds, h, g, tid, io_type):
        """The fused pre-conv of the call's rows, as conv1d_verify outputs them: this head's x rows, then its
        group's B and C columns, computed once per CTA into shared memory (one thread per channel; every warp
        then reads its own rows and columns)."""
        P, N = self.headdim, self.d_state
        threads = self.num_warps * WARP
        x_channels = a.nheads * P
        B_first = x_channels + g * N
        C_first = x_channels + (a.nheads // a.heads_per_group) * N + g * N
        cute.arch.sync_threads()   # every warp has read the previous rows
        for i in cutlass.range(tid, self.conv_row, threads, unroll=1):
            c = h * P + i
            if i >= P + N:
                c = C_first + i - (P + N)
            elif i >= P:
                c = B_first + i - P
            stage_rows(cv, sConv, i, b, slot, valid, folds, c, a.seqlen, io_type)
        cute.arch.sync_threads()

    def _ticket(self, a, slot, k):
        """Ticket [slot, k]: of group k's heads, or with k = G of the groups."""
        return a.tickets + slot * a.stride_tickets_slot + k * a.stride_tickets_group

    @cute.jit
    def _write_head_channels(self, a, cv, b, slot, folds, h, tid):
        """Write this head's x channels of the conv pool and window record as conv1d_verify would, once its conv
        has read them (only this CTA reads them): their stores then overlap the passes."""
        conv_type, io_type = cutlass_dtype(self.conv_dtype), cutlass_dtype(self.io_dtype)
        P, threads = self.headdim, self.num_warps * WARP
        for c in cutlass.range(h * P + tid, h * P + P, threads, unroll=1):
            walk_channel(cv, self.mode, b, slot, c, folds, a.seqlen, conv_type, io_type)

    @cute.jit
    def _conv_bookkeeping(self, a, cv, flag, b, slot, folds, g, arrival, tid):
        """The rest of the fused conv's pool and window record, as conv1d_verify would write them (this head's x
        channels are written: :meth:`_write_head_channels`): a group's B and C channels by the last of its heads
        to arrive (ticket [slot, g], taken once the head's conv had read them: ``arrival``); in compact mode the
        window count, which every head reads, by the last group to finish (ticket [slot, G])."""
        conv_type, io_type = cutlass_dtype(self.conv_dtype), cutlass_dtype(self.io_dtype)
        P, N, threads = self.headdim, self.d_state, self.num_warps * WARP
        G = a.nheads // a.heads_per_group
        if settle_ticket(self._ticket(a, slot, g), arrival, a.heads_per_group, flag, tid) != 0:
            for i in cutlass.range(tid, 2 * N, threads, unroll=1):
                c = a.nheads * P + g * N + i   # B columns of group g, then its C columns
                if i >= N:
                    c = a.nheads * P + G * N + g * N + i - N
                walk_channel(cv, self.mode, b, slot, c, folds, a.seqlen, conv_type, io_type)
            if cutlass.const_expr(self.mode == "compact"):
                if last_arrival(self._ticket(a, slot, G), G, flag, tid) != 0:
                    if tid == 0:
                        cute.make_tensor(a.conv_window_count, cute.make_layout(
                            (a.num_slots,), stride=(a.stride_conv_window_count_slot,)))[slot] = a.seqlen

    @cute.jit
    def _reduce_rows(self, sums, lane):
        """Warp-sum R per-lane row partials, leaving row ``lane >> (5 - log2 R)``'s total on each lane.

        A reduce-scatter: at each of the first log2 R butterfly steps a lane keeps half of its rows and
        trades the other half with its partner (R - 1 shuffles in all), then the last 5 - log2 R steps add
        single values, instead of 5 shuffles for every row. The order of additions is fixed (deterministic).
        """
        R = self.rows_per_warp
        for level in cutlass.range_constexpr(self.row_bits):
            offset, half = 16 >> level, R >> (level + 1)
            upper = (lane & offset) != 0
            for k in cutlass.range_constexpr(half):
                send = Float32(cutlass.select_(upper, sums[k], sums[k + half]))
                keep = Float32(cutlass.select_(upper, sums[k + half], sums[k]))
                sums[k] = keep + cute.arch.shuffle_sync_bfly(send, offset)
        total = sums[0]
        for level in cutlass.range_constexpr(self.row_bits, 5):
            total = total + cute.arch.shuffle_sync_bfly(total, 16 >> level)
        return total

    @cute.jit
    def _advance(self, st, delta: Float32, decay: Float32, x_buf, B_raw, pool_type: cutlass.Constexpr):
        """One token: h = round_to_pool(h·decay + (Δ·x) ⊗ B), as explicit fmas, shared by the fold, the token
        loop and a decode so that all compute the same bits. ``x_buf`` holds x, or Δ·x when the tiles do."""
        for r in cutlass.range_constexpr(self.rows_per_warp):
            dtx = x_buf[r] if cutlass.const_expr(self.scaled_x) else delta * x_buf[r].to(Float32)
            for j in cutlass.range_constexpr(self.cols_per_lane):
                st[r, j] = cute.math.fma(st[r, j], decay, dtx * B_raw[j].to(Float32))
                if cutlass.const_expr(self.pool_dtype != "fp32"):
                    st[r, j] = st[r, j].to(pool_type).to(Float32)

    def _lane_columns(self, state, slot, h, row, lane):
        """The V contiguous state columns a lane owns in one row: one 16-byte access for an fp32 pool."""
        return cute.zipped_divide(state[slot, h, row, None], (self.cols_per_lane,))[None, lane]

    @cute.jit
    def _load_state(self, state, slot, h, row0, lane, st, pool_type):
        values = cute.make_rmem_tensor((self.cols_per_lane,), pool_type)
        for r in cutlass.range_constexpr(self.rows_per_warp):
            cute.autovec_copy(self._lane_columns(state, slot, h, row0 + r, lane), values)
            for j in cutlass.range_constexpr(self.cols_per_lane):
                st[r, j] = values[j].to(Float32)

    @cute.jit
    def _store_state(self, state, slot, h, row0, lane, st, pool_type):
        values = cute.make_rmem_tensor((self.cols_per_lane,), pool_type)
        for r in cutlass.range_constexpr(self.rows_per_warp):
            for j in cutlass.range_constexpr(self.cols_per_lane):
                values[j] = st[r, j].to(pool_type)
            cute.autovec_copy(values, self._lane_columns(state, slot, h, row0 + r, lane))

    @cute.jit
    def _count(self, a, h, tid):
        """Count one rejected index per request (head 0, its first row split, thread 0) when the caller passed a
        counter."""
        _, _, split = cute.arch.block_idx()
        if a.has_rejected != 0:
            if h == 0 and split == 0:
                if tid == 0:
                    cute.arch.atomic_add(a.rejected, Int32(1))
