"""What the register-operand products (``fwd_register_operands``, kernel_src/ssd_fwd_paired.py) take for granted about
their register layouts, checked at trace time on static thread indices (no GPU: the DSL folds the layouts of identity
tensors to numbers). Run by tests/test_operand_layouts.py in its own process, with ``CUTE_DSL_ARCH=sm_90a`` (the
warpgroup MMA's atoms are made for that arch only); prints one JSON object of counts.

- ``index``: an A operand's value e sits at the coordinates of an m64nK accumulator's value e, every thread, K 64
  and 128 (``accumulator_operand`` rounds h into its A operand value for value; ``operand_as_accumulator`` views x's
  A operand as an accumulator for D ⊙ x, the gate and the weighing).
- ``ldmatrix``: ``load_operand``'s transposing ldmatrix delivers xᵀ's A operand: what each lane receives (PTX's
  ldmatrix ``.trans``: lane t, register m, half k gets element t / 4 of the row whose address lane 8m + 2(t % 4) + k
  gave) is the A layout's coordinate. ``ldmatrix_control``: the same with the non-transposing delivery, which must
  mismatch (the check can fail).
- ``stmatrix``: yᵀ staged by transposing stmatrix through the transposed view of y's tile lands as y: the element of
  row r of matrix m (lane 8m + r's address), column c, is lane 4c + r / 2's register m, half r % 2 (PTX's
  stmatrix ``.trans``), and that is the accumulator value of the same (row, column) transposed.
  ``stmatrix_control``: the non-transposing placement, which must mismatch.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import BFloat16  # noqa: E402
from cutlass.cute.nvgpu import warp  # noqa: E402

from kernel_src.ssd_tiles import WarpgroupMmaParts, transposed  # noqa: E402

THREADS, WARP = 128, 32
A_COORDS, C_COORDS, SOURCES, EXPECTED, DESTINATIONS, STAGED = ({} for _ in range(6))


def record(table, key, coordinate):
    """(Plain Python, so that the DSL leaves the comparison alone.)"""
    table[key] = tuple(int(c) for c in coordinate)


def y_view():
    """The (P, rows) view of an identity (rows, P) tile: view (p, i) holds y's coordinate (i, p)."""
    return transposed(cute.make_identity_tensor((64, 64)), 64, 64)


@cute.jit
def probe():
    for k in cutlass.range_constexpr(64, 129, 64):
        for t in cutlass.range_constexpr(THREADS):
            mma = WarpgroupMmaParts(BFloat16, t, 1)
            a = mma.from_registers[(True, True)].get_slice(t).partition_A(cute.make_identity_tensor((64, k)))
            c = mma.thr.partition_C(cute.make_identity_tensor((64, k)))
            for e in cutlass.range_constexpr(cute.size(a)):
                record(A_COORDS, (k, t, e), a[e])
                record(C_COORDS, (k, t, e), c[e])
    for t in cutlass.range_constexpr(THREADS):
        mma = WarpgroupMmaParts(BFloat16, t, 1)
        tiled = mma.from_registers[(True, True)]
        load = cute.make_tiled_copy_A(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4),
                                                          BFloat16), tiled).get_slice(t)
        sources = load.partition_S(y_view())  # (x's tile is (rows, P) as y's)
        expected = load.retile(tiled.get_slice(t).partition_A(cute.make_identity_tensor((64, 64))))
        for i in cutlass.range_constexpr(cute.size(sources)):
            record(SOURCES, (t, i), sources[i])
        for i in cutlass.range_constexpr(cute.size(expected)):
            record(EXPECTED, (t, i), expected[i])
        store = cute.make_tiled_copy_C(cute.make_copy_atom(warp.StMatrix8x8x16bOp(True, 4), BFloat16),
                                       mma.by_major[(False, False)]).get_slice(t)
        destinations = store.partition_D(y_view())
        staged = store.retile(mma.thr.partition_C(cute.make_identity_tensor((64, 64))))
        for i in cutlass.range_constexpr(cute.size(destinations)):
            record(DESTINATIONS, (t, i), destinations[i])
        for i in cutlass.range_constexpr(cute.size(staged)):
            record(STAGED, (t, i), staged[i])


def ldmatrix_counts(transposing):
    """(right, wrong) over every lane, k block, register and half: the received (p, j) against the A layout's."""
    right = wrong = 0
    for first in range(0, THREADS, WARP):
        for t in range(WARP):
            for block in range(4):
                for m in range(4):
                    for half in range(2):
                        if transposing:
                            lane, element = 8 * m + 2 * (t % 4) + half, t // 4
                        else:
                            lane, element = 8 * m + t // 4, 2 * (t % 4) + half
                        j, p = SOURCES[(first + lane, element + 8 * block)]
                        if EXPECTED[(first + t, half + 2 * m + 8 * block)] == (p, j):
                            right += 1
                        else:
                            wrong += 1
    return right, wrong


def stmatrix_counts(transposing):
    """(right, wrong) over every stored element: y's (i, p) against the (p, i) of the yᵀ value stored there."""
    right = wrong = 0
    for first in range(0, THREADS, WARP):
        for group in range(4):  # (a thread's 32 values: four stmatrix.x4 of 8)
            for m in range(4):
                for r in range(8):
                    for c in range(8):
                        i, p = DESTINATIONS[(first + 8 * m + r, c + 8 * group)]
                        lane, half = (4 * c + r // 2, r % 2) if transposing else (4 * r + c // 2, c % 2)
                        if STAGED[(first + lane, half + 2 * m + 8 * group)] == (p, i):
                            right += 1
                        else:
                            wrong += 1
    return right, wrong


if __name__ == "__main__":
    cute.compile(probe)
    index = [sum(A_COORDS[key] == C_COORDS[key] for key in A_COORDS if key[0] == k) for k in (64, 128)]
    print(json.dumps({"index": {"equal": index, "of": [sum(key[0] == k for key in A_COORDS) for k in (64, 128)]},
                      "ldmatrix": ldmatrix_counts(True), "ldmatrix_control": ldmatrix_counts(False),
                      "stmatrix": stmatrix_counts(True), "stmatrix_control": stmatrix_counts(False)}))
