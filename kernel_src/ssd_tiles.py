"""Tile mechanism shared by the SSD kernels (ssd_fwd, ssd_bwd_dstates, ssd_bwd_chunk): 64-token blocks in
swizzled shared tiles, a tiled warp MMA read with ldmatrix, fragment views and stores, and the 64-bit row masks
that split a block at sequence boundaries."""

# (no "from __future__ import annotations": the DSL reads annotations as live objects)
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import nvvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup
from cutlass.cutlass_dsl import dsl_user_op

from kernel_src.ssm_math import warp_inclusive_scans

TILE = 64        # tokens per block: the M and K extent of the intra-block products
VECTOR = 8       # 16-byte cp.async of 16-bit elements: the runtime checks strides and bases for it
SMEM_ALIGN = 128
CHUNK = 8        # elements per 16-byte shared-memory vector
QUAD = 4         # lanes of an MMA accumulator row: two adjacent columns each of every 8-column group
SCAN_GROUP = 4   # blocks whose Δ a walk's first warps scan at once, warp w the group's block w


def async_tile_copy(io_type, threads: int):
    """A cp.async copy of 16-bit tiles, 16 bytes per thread per step, rows of 64 elements (8 threads per row)."""
    return cute.make_tiled_copy_tv(
        cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), io_type, num_bits_per_copy=128),
        cute.make_layout((threads // 8, 8), stride=(8, 1)), cute.make_layout((1, VECTOR)))


@cute.jit
def load_tile(g2s, thr, src, ident, dst, tile, coord, L):
    """cp.async the ``tile``-shaped block ``coord`` of ``src`` (rows along L) into ``dst``; rows past L become zeros."""
    src_part = thr.partition_S(cute.local_tile(src, tile, coord))
    coords = thr.partition_S(cute.local_tile(ident, tile, coord))
    dst_part = thr.partition_D(dst)
    for m in cutlass.range_constexpr(cute.size(dst_part.shape[1])):
        if cute.elem_less(coords[0, m, 0][0], L):
            cute.copy(g2s, src_part[None, m, None], dst_part[None, m, None])
        else:
            dst_part[None, m, None].fill(0)


@cute.jit
def store_state(dst, mma, acc, p0, state_type: cutlass.Constexpr, paired: cutlass.Constexpr = False):
    """An accumulator over (64 rows of P from p0, a multiple of 64, N) into a (P, N) state block, in
    ``state_type``; with ``paired`` each thread's column pairs as one store (8 bytes for fp32: ``dst`` must be
    known to be aligned for it)."""
    if cutlass.const_expr(paired):
        rows = cute.local_tile(dst, (64, cute.size(dst, mode=[1])), (p0 // 64, 0))
        store_pairs(mn_view(acc), mn_view(mma.thr.partition_C(rows)), state_type)
    else:
        coords = mma.thr.partition_C(cute.make_identity_tensor((64, cute.size(dst, mode=[1]))))
        for e in cutlass.range_constexpr(cute.size(acc)):
            dst[p0 + coords[e][0], coords[e][1]] = acc[e].to(state_type)


@cute.jit
def store_state_vectors(dst, mma, acc, p0, dtype: cutlass.Constexpr):
    """An accumulator over (64 rows of P from p0, a multiple of 64, N) into a (P, N) state block in a 16-bit
    ``dtype``, in 16-byte vectors, through registers alone (``dst``'s rows must be known to be 16-byte aligned).

    An MMA accumulator gives the four lanes of a quad two adjacent columns each of every 8-column group of a row
    (lane q columns 2q, 2q + 1): a store per pair is 4 bytes, and a warp's store then writes 16 bytes of each of
    8 rows. Here each quad transposes the pairs of 4 groups by two butterfly shuffles, so that lane q holds group
    q's whole 8 columns and stores them at once: a quarter of the store instructions, each writing whole sectors
    (the pair stores held the reverse pass on the memory pipeline's throughput)."""
    rows = cute.local_tile(dst, (64, cute.size(dst, mode=[1])), (p0 // 64, 0))
    frag = mn_view(acc)
    assert cute.size(frag, mode=[1]) // 2 % QUAD == 0, "a lane's 8-column groups must come in sets of four"
    coords = mn_view(mma.thr.partition_C(cute.make_identity_tensor((64, cute.size(dst, mode=[1])))))
    quad = cute.arch.lane_idx() % QUAD
    odd = quad % 2 != 0    # the lane's place in its pair (first butterfly)
    upper = quad >= 2      # the pair's place in the quad (second butterfly)
    packed = cute.make_rmem_tensor((2 * QUAD,), dtype)
    words = cute.recast_tensor(packed, Int32)   # word j: the lane's pair of group j of the set
    out = cute.make_rmem_tensor((QUAD,), Int32)  # group `quad` of the set: the pairs of lanes 0 .. 3
    for r in cutlass.range_constexpr(cute.size(frag, mode=[0])):
        for m in cutlass.range_constexpr(cute.size(frag, mode=[1]) // 2 // QUAD):
            for j in cutlass.range_constexpr(QUAD):
                packed[2 * j] = frag[r, (0, QUAD * m + j)].to(dtype)
                packed[2 * j + 1] = frag[r, (1, QUAD * m + j)].to(dtype)
            # first butterfly (lanes q, q ^ 1): keep the groups of the lane's parity, trade the others; unit s is
            # then group 2s + parity from both lanes of the pair, in lane order
            units = []
            for s in cutlass.range_constexpr(2):
                even, odd_word = words[2 * s], words[2 * s + 1]
                got = cute.arch.shuffle_sync_bfly(Int32(cutlass.select_(odd, even, odd_word)), 1)
                keep = Int32(cutlass.select_(odd, odd_word, even))
                units.append((Int32(cutlass.select_(odd, got, keep)), Int32(cutlass.select_(odd, keep, got))))
            # second butterfly (lanes q, q ^ 2): keep unit `upper` (group quad), trade the other
            for k in cutlass.range_constexpr(2):
                got = cute.arch.shuffle_sync_bfly(Int32(cutlass.select_(upper, units[0][k], units[1][k])), 2)
                keep = Int32(cutlass.select_(upper, units[1][k], units[0][k]))
                out[k] = Int32(cutlass.select_(upper, got, keep))
                out[2 + k] = Int32(cutlass.select_(upper, keep, got))
            # the lane's own column in group `quad` lies in that group's 8-column vector
            col = coords[r, (0, QUAD * m)][1]
            for j in cutlass.range_constexpr(1, QUAD):
                col = Int32(cutlass.select_(quad == j, coords[r, (0, QUAD * m + j)][1], col))
            vector(rows[coords[r, (0, 0)][0], None], col // CHUNK).store(cute.recast_tensor(out, dtype).load())


@cute.jit
def load_state(acc, mma, src, p0, valid):
    """acc = a (P, N) state block's rows p0 .. p0 + 63 in fp32 (zeros when ``valid`` is 0)."""
    coords = mma.thr.partition_C(cute.make_identity_tensor((64, cute.size(src, mode=[1]))))
    for e in cutlass.range_constexpr(cute.size(acc)):
        v = Float32(0.0)
        if valid != 0:
            v = src[p0 + coords[e][0], coords[e][1]].to(Float32)
        acc[e] = v


def view(pointer, shape, *strides):
    """A tensor over ``pointer`` with these (dynamic) strides: how the kernels see the flat ABI's arrays."""
    return cute.make_tensor(pointer, cute.make_layout(shape, stride=strides))


def vec(stride):
    """A stride the runtime checked to be a multiple of VECTOR elements (rows moved 16 bytes at a time)."""
    return cute.assume(stride, divby=VECTOR)


def pairs(stride):
    """A stride the runtime checked (or the workspace layout makes) even: states written an accumulator pair at a
    time (two values in one store)."""
    return cute.assume(stride, divby=2)


class MmaParts:
    """A tiled warp MMA (m16n8k16, fp32 accumulation, ``warps`` = (rows, columns) of warps) with its ldmatrix
    copies: ``gemm`` runs acc += A·Bᵀ over K from two shared tiles."""

    asynchronous = False

    def __init__(self, io_type, warps, tid):
        wm, wn = warps
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(io_type, Float32, (16, 8, 16)), cute.make_layout((wm, wn, 1)),
                                        permutation_mnk=(wm * 16, wn * 16, 16))
        self.tiled = tiled_mma
        self.thr = tiled_mma.get_slice(tid)
        self.tid = tid
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), io_type)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), io_type)
        self.copy_A = cute.make_tiled_copy_A(ldsm, tiled_mma)
        self.copy_At = cute.make_tiled_copy_A(ldsm_t, tiled_mma)
        self.copy_B = cute.make_tiled_copy_B(ldsm, tiled_mma)
        self.copy_Bt = cute.make_tiled_copy_B(ldsm_t, tiled_mma)

    def _operand(self, copy, smem, fragment):
        thr = copy.get_slice(self.tid)
        return thr.partition_S(smem), thr.retile(fragment)

    @cute.jit
    def gemm(self, acc, sA, sB, k_blocks: cutlass.Constexpr, a_transposed: cutlass.Constexpr = False,
             b_transposed: cutlass.Constexpr = False, wait: cutlass.Constexpr = True,
             accumulate: cutlass.Constexpr = True):
        """acc (M × N) += sA (M × K) · sB (N × K)ᵀ from K-contiguous tiles, or from transposed views of
        M- / N-contiguous ones (read with transposing ldmatrix) when asked. (Warp MMAs are synchronous and always
        accumulate: ``wait`` and ``accumulate`` are :class:`WarpgroupMmaParts`'.)"""
        assert accumulate, "warp MMAs add to acc: zero a fresh accumulator first"
        copy_A = self.copy_At if a_transposed else self.copy_A
        copy_B = self.copy_Bt if b_transposed else self.copy_B
        frag_A = self.thr.make_fragment_A(self.thr.partition_A(sA))
        frag_B = self.thr.make_fragment_B(self.thr.partition_B(sB))
        src_A, dst_A = self._operand(copy_A, sA, frag_A)
        src_B, dst_B = self._operand(copy_B, sB, frag_B)
        for k in cutlass.range_constexpr(k_blocks):
            cute.copy(copy_A, src_A[None, None, k], dst_A[None, None, k])
            cute.copy(copy_B, src_B[None, None, k], dst_B[None, None, k])
            cute.gemm(self.tiled, acc, frag_A[None, None, k], frag_B[None, None, k], acc)

    def wait(self, pending: int = 0):
        """(Warp MMAs are synchronous: nothing to wait for.)"""


class WarpgroupMmaParts:
    """Hopper warpgroup MMA (wgmma, sm_90a only; ``warpgroups`` of 4 warps side by side along N, fp32
    accumulation) with :class:`MmaParts`' interface: ``gemm`` reads both operands straight from the shared tiles
    (``smem_layout``'s 128-byte swizzle is the wgmma canonical one; a transposed view is an M- / N-major operand),
    so there are no ldmatrix copies and one instruction covers 64 × (64 / warpgroups) × 16. ``gemm_registers``
    takes A from registers instead: an accumulator of an earlier product, rounded in place
    (:meth:`accumulator_operand`)."""

    asynchronous = True  # gemm(..., wait=False) returns while the product runs

    def __init__(self, io_type, tid, warpgroups: int = 1):
        def tiled(a_major, b_major, a_source=warpgroup.OperandSource.SMEM, accumulate=True):
            # more warpgroups side by side along N, each m64 × 64/warpgroups per instruction
            mma = sm90_utils.make_trivial_tiled_mma(io_type, io_type, a_major, b_major, Float32, (1, warpgroups, 1),
                                                    (64, 64 // warpgroups), a_source=a_source)
            # D += A·B, or D = A·B for a product's first k block into a fresh accumulator (no zeroing); set here,
            # outside the kernels' loops: the flag is state of the object, which a loop body must not rebind
            mma.set(warpgroup.Field.ACCUMULATE, accumulate)
            return mma
        k, mn = OperandMajorMode.K, OperandMajorMode.MN
        modes = {(False, False): (k, k), (False, True): (k, mn), (True, True): (mn, mn)}  # by (A, B) transposed
        self.by_major = {major: tiled(*modes[major]) for major in modes}
        self.fresh = {major: tiled(*modes[major], accumulate=False) for major in modes}
        # A from registers (K-major by construction), B an MN-major tile: S · x with S straight from the mask
        self.from_registers = tiled(k, mn, warpgroup.OperandSource.RMEM)
        self.thr = self.by_major[(False, False)].get_slice(tid)  # the accumulators' layout: the same for all
        self.tid = tid
        self.io_type = io_type

    def _operand(self, tile):
        # the element-offset swizzle of smem_layout as a byte swizzle on the pointer, where the descriptors want it
        return cute.make_tensor(cute.recast_ptr(tile.iterator, cute.make_swizzle(3, 4, 3), dtype=self.io_type),
                                tile.layout.outer)

    @cute.jit
    def gemm(self, acc, sA, sB, k_blocks: cutlass.Constexpr, a_transposed: cutlass.Constexpr = False,
             b_transposed: cutlass.Constexpr = False, wait: cutlass.Constexpr = True,
             accumulate: cutlass.Constexpr = True):
        """acc (M × N) += sA (M × K) · sB (N × K)ᵀ, as :meth:`MmaParts.gemm` (without ``accumulate`` the first k
        block overwrites acc: no zeroing). With ``wait`` it waits for this and every product issued before it;
        without, the product runs on while the caller issues more (which must not touch ``acc`` until a waiting
        one returns)."""
        tiled_mma = self.by_major[(a_transposed, b_transposed)]
        thr = tiled_mma.get_slice(self.tid)
        frag_A = tiled_mma.make_fragment_A(thr.partition_A(self._operand(sA)))
        frag_B = tiled_mma.make_fragment_B(thr.partition_B(self._operand(sB)))
        first = tiled_mma if accumulate else self.fresh[(a_transposed, b_transposed)]
        self._issue(tiled_mma, acc, frag_A, frag_B, k_blocks, wait, first)

    @cute.jit
    def _issue(self, tiled_mma, acc, frag_A, frag_B, k_blocks: cutlass.Constexpr, wait: cutlass.Constexpr,
               first=None):
        """The k blocks' MMAs as one commit group, after a fence that orders the register writes before them (the
        accumulators', and A's when it comes from registers); with ``wait``, waits for every group issued. The first
        k block runs on ``first`` when given (a tiled MMA that overwrites the accumulator)."""
        warpgroup.fence()
        for k in cutlass.range_constexpr(k_blocks):
            cute.gemm(first if (k == 0 and first is not None) else tiled_mma, acc, frag_A[None, None, k],
                      frag_B[None, None, k], acc)
        warpgroup.commit_group()
        if cutlass.const_expr(wait):
            warpgroup.wait_group(0)

    def wait(self, pending: int = 0):
        """Wait for the products issued so far (``gemm(..., wait=False)``), all but the last ``pending`` of them."""
        warpgroup.wait_group(pending)

    @cute.jit
    def accumulator_operand(self, acc, k: cutlass.Constexpr):
        """A 64 × ``k`` accumulator rounded to the I/O dtype as the A operand of :meth:`gemm_registers`, in the
        registers that hold it: an m64nK accumulator's values (column pair, row half, 8-column block) are, in
        order, the k16 A fragments' (column pair, row half, k half, k block), so the value at each index carries
        over. One warpgroup only: side by side along N, each would hold part of the columns A needs whole."""
        thr = self.from_registers.get_slice(self.tid)
        frag = thr.make_fragment_A(thr.partition_shape_A((64, k)))
        assert cute.size(frag) == cute.size(acc), "the accumulator must hold the operand's every value (one warpgroup)"
        for e in cutlass.range_constexpr(cute.size(acc)):
            frag[e] = acc[e].to(self.io_type)
        return frag

    @cute.jit
    def gemm_registers(self, acc, frag_A, sB, k_blocks: cutlass.Constexpr, wait: cutlass.Constexpr = True):
        """acc += A · sBᵀ with A an :meth:`accumulator_operand` and ``sB`` a transposed (MN-major) tile view."""
        tiled_mma = self.from_registers
        thr = tiled_mma.get_slice(self.tid)
        frag_B = tiled_mma.make_fragment_B(thr.partition_B(self._operand(sB)))
        self._issue(tiled_mma, acc, frag_A, frag_B, k_blocks, wait)


def make_mma(io_type, tid, warps, warpgroups: int):
    """A CTA's MMA parts: ``warpgroups`` side by side along N (wgmma, sm_90a) when non-zero, else warp MMAs over
    the (rows, columns) ``warps`` layout."""
    if warpgroups:
        return WarpgroupMmaParts(io_type, tid, warpgroups)
    return MmaParts(io_type, warps, tid)


@dsl_user_op
def role_sync(barrier_id: int, number_of_threads: int, *, loc=None, ip=None):
    """Wait on named barrier ``barrier_id`` with ``number_of_threads`` participants that reach it from different
    code (warps in different roles): PTX's unaligned ``barrier.cta.sync``, as the aligned ``bar.sync`` that
    ``cute.arch.barrier`` emits requires every participant to execute the same instruction (compute-sanitizer's
    synccheck reports the aligned form here as a divergent barrier)."""
    nvvm.barrier_cta_sync(Int32(barrier_id).ir_value(loc=loc, ip=ip),
                          thread_count=Int32(number_of_threads).ir_value(loc=loc, ip=ip), aligned=False, loc=loc, ip=ip)


def role_arrive(barrier_id: int, number_of_threads: int):
    """Arrive on a named barrier that :func:`role_sync` waits on elsewhere (the unaligned ``barrier.cta.arrive``)."""
    cute.arch.barrier_arrive(barrier_id=barrier_id, number_of_threads=number_of_threads, aligned=False)


def fence_operands(mma):
    """Before the barrier that publishes shared tiles to ``mma``: wgmma reads them through the async proxy, so
    this thread's ordinary (and cp.async) writes are fenced for it; warp MMAs read them with ordinary loads."""
    if isinstance(mma, WarpgroupMmaParts):
        cute.arch.fence_proxy("async.shared", space="cta")


def buffer(storage_range, index, columns: int):
    """Tile ``index`` (a Python int, or a dynamic value) of an array of (TILE, columns) tiles held in one shared array: a
    double-buffered operand's two, or a ring's slots."""
    offset = index * (TILE * columns)
    if not isinstance(index, int):  # (the swizzle and the 16-byte copies need the offset's alignment known)
        offset = cute.assume(offset, divby=TILE * columns)
    return cute.make_tensor(storage_range.data_ptr() + offset, smem_layout((TILE, columns)))


def vector(row, index):
    """Elements 8·index .. 8·index + 7 of a row: one 16-byte vector of 16-bit values (32 bytes of fp32)."""
    return cute.zipped_divide(row, (CHUNK,))[None, index]


def scan_slot(first, slot):
    """Slot ``slot`` (static or dynamic) of per-block shared arrays laid one after another, given the first one's view:
    a scan group's (SCAN_GROUP of them; a block's cumsum does not depend on the blocks before it, so a walk's first
    SCAN_GROUP warps scan a group of blocks at once and the walk's per-block chain holds no scan), or a ring's."""
    return cute.make_tensor(first.iterator + slot * cute.size(first), first.layout)


def smem_layout(shape):
    """Rows of 64 16-bit elements (128 B) with the 3-bit swizzle ldmatrix reads without bank conflicts."""
    atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
    return cute.tile_to_shape(atom, shape, tuple(range(len(shape))))


@cute.jit
def scale_rows(scalings, s, part, per_row: cutlass.Constexpr, io_type: cutlass.Constexpr):
    """dst[s, cols] = src[s, cols] · factor for each (src, dst, factor) of ``scalings``, this thread's share of row s,
    8 elements (16 bytes) at a time. The product is taken in the 16-bit ``io_type`` with the factor rounded to it first:
    packed pairs, one instruction per two elements (the fp32 product took an unpack and a multiply per element and a
    pack per pair; docs/PERF_NOTES.md, twenty-third session). The factor's rounding is the one addition: at most 2^-8
    relative in bf16, 2^-11 in fp16's normal range (an fp16 factor below 2^-24 becomes 0, one past 65504 inf). Every
    share is read before anything is written: the compiler cannot tell the tiles apart, so a read after a write would
    wait behind it, and each read's latency would be exposed in turn."""
    loaded = []  # (destination vector, factor in io_type, source values)
    for src, dst, factor in scalings:
        share = cute.size(src, mode=[1]) // CHUNK // per_row
        rounded = factor.to(io_type)
        for k in cutlass.range_constexpr(share):
            chunk = part * share + k
            loaded.append((vector(dst[s, None], chunk), rounded, vector(src[s, None], chunk).load()))
    for dst_vector, factor, values in loaded:
        dst_vector.store(values * factor)


@cute.jit
def copy_row(src, dst, s, part, per_row: cutlass.Constexpr):
    """dst[cols] = src[s, cols] for this thread's share of row s, 16 bytes at a time; the row's ``per_row``
    threads take adjacent vectors in turn (a global row is then written in whole sectors)."""
    src_row = cute.zipped_divide(src[s, None], (CHUNK,))
    dst_row = cute.zipped_divide(dst, (CHUNK,))
    chunks = cute.size(src, mode=[1]) // CHUNK
    for k in cutlass.range_constexpr(chunks // per_row):
        dst_row[None, k * per_row + part].store(src_row[None, k * per_row + part].load())


@cute.jit
def store_pairs(frag, smem, dtype: cutlass.Constexpr):
    """A fragment (rows, columns view) into its partition of a tile (shared, or global) in ``dtype``: each
    thread's two adjacent columns (an MMA accumulator pair) as one store."""
    pair = cute.make_rmem_tensor((2,), dtype)
    for r in cutlass.range_constexpr(cute.size(frag, mode=[0])):
        for n in cutlass.range_constexpr(cute.size(frag, mode=[1]) // 2):
            pair[0] = frag[r, (0, n)].to(dtype)
            pair[1] = frag[r, (1, n)].to(dtype)
            smem[r, (None, n)].store(pair.load())


def matrix_store(mma, smem, dtype):
    """A warpgroup MMA accumulator's stores into its tile ``smem`` in ``dtype`` (16-bit) with stmatrix, four 8 × 8
    matrices (8 values of a thread) per shared store where :func:`store_pairs` stores 2; made once, outside a loop
    that stores into the same tile. For :func:`store_matrices`."""
    copy = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), dtype),
                                  mma.by_major[(False, False)])
    thr = copy.get_slice(mma.tid)
    return copy, thr, thr.partition_D(smem)


@cute.jit
def store_matrices(store, acc, dtype: cutlass.Constexpr):
    """``acc`` rounded to ``dtype`` into the tile of ``store`` (:func:`matrix_store`)."""
    copy, thr, destination = store
    rounded = cute.make_rmem_tensor_like(acc, dtype)
    rounded.store(acc.load().to(dtype))
    cute.copy(copy, thr.retile(rounded), destination)


def mn_view(acc):
    """An MMA accumulator (or its partition of a tile) as (rows, columns) of the thread's fragment
    (the view the CuTe DSL flash-attention example uses): ((2, MMA_M), (2, MMA_N)) for a warp MMA, whose
    value mode is (column pair, row half); ((2, MMA_M), (2, (n / 8, MMA_N))) for an m64nN warpgroup MMA, whose
    value mode adds the n / 8 column blocks."""
    shape = cute.make_layout(acc.layout.shape)
    value_shape, value_stride = shape.shape[0], shape.stride[0]
    rows = ((value_shape[1], shape.shape[1]), (value_stride[1], shape.stride[1]))
    if cutlass.const_expr(len(value_shape) == 2):
        cols = ((value_shape[0], shape.shape[2]), (value_stride[0], shape.stride[2]))
    else:
        cols = ((value_shape[0], (value_shape[2], shape.shape[2])),
                (value_stride[0], (value_stride[2], shape.stride[2])))
    rows_cols = cute.make_layout((rows[0], cols[0]), stride=(rows[1], cols[1]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, rows_cols))


def transposed(tile, rows, cols):
    """The (cols, rows) view of a (rows, cols) shared tile (read with transposing ldmatrix)."""
    return cute.composition(tile, cute.make_layout((cols, rows), stride=(rows, 1)))


@cute.jit
def mask_bit(lo: Int32, hi: Int32, pos: Int32) -> Int32:
    """Bit ``pos`` (0..63) of the 64-bit mask (lo, hi)."""
    word = lo
    shift = pos
    if pos >= 32:
        word = hi
        shift = pos - 32
    return (word >> shift) & Int32(1)


@cute.jit
def next_change(lo: Int32, hi: Int32, pos: Int32) -> Int32:
    """The first set bit above ``pos`` in the 64-bit mask (lo, hi), or TILE if none."""
    above_lo = Int32(0)
    above_hi = hi
    if pos < 31:
        above_lo = lo & ~((Int32(2) << pos) - Int32(1))
    if pos >= 32:
        above_hi = Int32(0)
        if pos < 63:
            above_hi = hi & ~((Int32(2) << (pos - 32)) - Int32(1))
    return first_set_bit(above_lo, above_hi)


@cute.jit
def first_set_bit(lo: Int32, hi: Int32) -> Int32:
    """The lowest set bit of the 64-bit mask (lo, hi), or TILE if none."""
    result = Int32(TILE)
    if hi != 0:
        result = Int32(32) + Int32(cute.arch.clz(cute.arch.brev(hi)))
    if lo != 0:
        result = Int32(cute.arch.clz(cute.arch.brev(lo)))
    return result


@cute.jit
def block_cumsum(d0: Float32, d1: Float32, A_log2: Float32, lane: Int32):
    """Warp: the inclusive cumsum of Δ·A·log2(e) over a 64-row block whose rows lane and lane + 32 hold Δ d0, d1."""
    term0 = d0 * A_log2
    term1 = d1 * A_log2
    c0, c1 = warp_inclusive_scans([term0, term1], lane)
    c1 = c1 + cute.arch.shuffle_sync(c0, 31)
    # The tree scan adds in a different order on every lane, so across a run of Δ = 0 the cumsums could
    # differ by rounding, and 2^(cs_t - cs_s) would not be exactly 1 there (with |Δ·A| ~ 1e6 the error is
    # ~2^3). Each row therefore takes the cumsum of the last row at or before it whose Δ·A is non-zero.
    return hold_over_zero_runs(c0, c1, term0 != Float32(0.0), term1 != Float32(0.0), lane)


@cute.jit
def previous_change(lo: Int32, hi: Int32, pos: Int32) -> Int32:
    """The last set bit at or below ``pos`` (0..63) in the 64-bit mask (lo, hi), or -1 if none."""
    below_lo = lo
    below_hi = Int32(0)
    if pos < 31:
        below_lo = lo & ((Int32(2) << pos) - Int32(1))
    if pos >= 32:
        below_hi = hi
        if pos < 63:
            below_hi = hi & ((Int32(2) << (pos - 32)) - Int32(1))
    result = Int32(-1)
    if below_lo != 0:
        result = Int32(31) - Int32(cute.arch.clz(below_lo))
    if below_hi != 0:
        result = Int32(63) - Int32(cute.arch.clz(below_hi))
    return result


@cute.jit
def hold_over_zero_runs(c0: Float32, c1: Float32, nonzero0, nonzero1, lane: Int32):
    """Rows lane and lane + 32 of a block cumsum: each row takes the value of the last row at or before it
    with a non-zero term (0 when there is none), so that rows separated only by zero terms hold bitwise
    equal cumsums."""
    mask0 = Int32(cute.arch.vote_ballot_sync(nonzero0))
    mask1 = Int32(cute.arch.vote_ballot_sync(nonzero1))
    upto = Int32(-1)  # rows <= lane within a half
    if lane < 31:
        upto = (Int32(2) << lane) - Int32(1)
    own0 = mask0 & upto
    own1 = mask1 & upto
    src0 = Int32(0)
    src1 = Int32(0)
    if own0 != 0:
        src0 = Int32(31) - Int32(cute.arch.clz(own0))
    if own1 != 0:
        src1 = Int32(31) - Int32(cute.arch.clz(own1))
    elif mask0 != 0:
        src1 = Int32(31) - Int32(cute.arch.clz(mask0))
    from_first0 = cute.arch.shuffle_sync(c0, src0)
    from_first1 = cute.arch.shuffle_sync(c0, src1)
    from_second1 = cute.arch.shuffle_sync(c1, src1)
    held0 = Float32(0.0)
    held1 = Float32(0.0)
    if own0 != 0:
        held0 = from_first0
    if own1 != 0:
        held1 = from_second1
    elif mask0 != 0:
        held1 = from_first1
    return held0, held1


@cute.jit
def load_raw_block(a, dt, seq_idx, row, h, block_start, start, end, lane):
    """A warp: the raw dt of a block's rows lane and lane + 32 inside [start, end) (zero elsewhere), and the
    seq_idx there and one row before (equal where no change can be; ``a`` holds has_seq_idx). They stay as loaded
    until the block's scan: converting or comparing them here would wait for the loads."""
    tok0 = block_start + lane
    tok1 = tok0 + 32
    dt0 = dt.element_type(0.0)
    dt1 = dt.element_type(0.0)
    here0 = Int32(0)
    before0 = Int32(0)
    here1 = Int32(0)
    before1 = Int32(0)
    if (tok0 >= start) & (tok0 < end):
        dt0 = dt[row, tok0, h]
        if a.has_seq_idx != 0:
            if tok0 > start:
                here0 = seq_idx[row, tok0]
                before0 = seq_idx[row, tok0 - 1]
    if (tok1 >= start) & (tok1 < end):
        dt1 = dt[row, tok1, h]
        if a.has_seq_idx != 0:
            here1 = seq_idx[row, tok1]
            before1 = seq_idx[row, tok1 - 1]
    return dt0, dt1, here0, before0, here1, before1


@cute.jit
def store_change_mask(seq_pairs, sChanges, lane):
    """A warp: the 64-bit mask of a block's rows where seq_idx differs from the row before, into sChanges, from
    the (here, before) seq_idx of rows lane and lane + 32 (``load_raw_block``'s)."""
    here0, before0, here1, before1 = seq_pairs
    change0 = Int32(0)
    change1 = Int32(0)
    if here0 != before0:
        change0 = Int32(1)
    if here1 != before1:
        change1 = Int32(1)
    store_change_bits(change0, change1, sChanges, lane)


@cute.jit
def store_change_bits(change0: Int32, change1: Int32, sChanges, lane):
    """A warp: rows lane and lane + 32's change flags (non-zero: a sequence starts there) as the block's 64-bit mask,
    into sChanges[0] (rows 0..31) and sChanges[1] (rows 32..63)."""
    lo = cute.arch.vote_ballot_sync(change0 != 0)
    hi = cute.arch.vote_ballot_sync(change1 != 0)
    if lane == 0:
        sChanges[0] = Int32(lo)
        sChanges[1] = Int32(hi)


@cute.jit
def source_tokens(a, source, L):
    """The tokens of a CTA's sequence source (its grid z): (row, start, end), row ``source`` whole, or with
    ``cu_seqlens`` its sequence ``source`` in row 0 (entries clamped to [0, L], so a bad one reads nothing out of
    bounds). ``a`` holds the kernel's cu_seqlens, has_cu_seqlens, num_seqs and stride_cu_seqlens_seq."""
    row = source
    start = Int32(0)
    end = L
    if a.has_cu_seqlens != 0:
        cu = view(a.cu_seqlens, (a.num_seqs + 1,), a.stride_cu_seqlens_seq)
        row = Int32(0)
        start = cute.math.min(cute.math.max(cu[source], Int32(0)), L)
        end = cute.math.min(cute.math.max(cu[source + 1], start), L)
    return row, start, end


@cute.jit
def count_changes(seq_idx, row, start, end, lane) -> Int32:
    """Every lane of a warp: the number of tokens t in (start, end) of a (batch, L) seq_idx row where the value
    differs from token t - 1 (the sequence starts a packed row holds after its first)."""
    count = Int32(0)
    for base in range(start + 1, end, 32):
        tok = base + lane
        change = Int32(0)
        if tok < end:
            if seq_idx[row, tok] != seq_idx[row, tok - 1]:
                change = Int32(1)
        count = count + Int32(cute.arch.popc(cute.arch.vote_ballot_sync(change != 0)))
    return count


@cute.jit
def widen(values):
    """Loaded 16-bit values (an even number, as loaded from adjacent elements: a pair, or a 16-byte vector) as fp32
    values. bf16 widens exactly, so each 32-bit word's halves are moved into the high halves of two words, a shift and
    a mask, where the conversion's lowering takes a byte permute and two shifts per pair (the same bits; timed on the
    H200 in ssd_fwd_paired, 2 % faster at Nemotron-H, and ssd_bwd_chunk, within noise: docs/PERF_NOTES.md,
    thirty-ninth session). fp16 is converted."""
    if cutlass.const_expr(values.dtype == cutlass.BFloat16):
        count = cute.size(values.shape)
        assert count % 2 == 0, "widen takes whole 32-bit words of 16-bit values"
        packed = cute.make_rmem_tensor(values.shape, values.dtype)
        packed.store(values)
        words = cute.recast_tensor(packed, Int32)
        widened = cute.make_rmem_tensor(values.shape, Int32)
        for k in cutlass.range_constexpr(count // 2):
            widened[2 * k] = words[k] << 16
            widened[2 * k + 1] = words[k] & Int32(-65536)
        return cute.recast_tensor(widened, Float32).load()
    return values.to(Float32)
