"""conv1d_fwd on the GPU: the causal conv1d over (packed) sequences, the prefill before ssd_fwd, against the fp64
oracle (``reference.conv1d_prefill``), and feeding conv1d_verify through a conv pool.

Needs a CUDA device and the conv1d_fwd cubins (the ci build: bf16 rows on a bf16 or an fp32 pool; the chain test
also conv1d_verify's); see tests/conftest.py. The outputs are one fp32 sum rounded to bf16, held to the bound of
the conv1d_verify tests (``_assert_out``); the final windows are raw inputs (or the tail of the initial window),
moved without arithmetic, so they must equal the oracle's exactly once rounded to the pool dtype.

The kernel's geometry the cases aim at: one CTA per (128 channels, 64-token block, row); the CTA holding a
sequence's first token reads its initial window, computes its first K-1 outputs (past the block's end when the
sequence starts in the block's last K-2 positions) and writes its final window.
"""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from test_conv1d_verify_gpu import (INT32_MAX, INT32_MIN, NEMOTRON_H_CHANNELS, ConvCase,  # noqa: E402
                                    _assert_out, _assert_untouched, _index, _same_bits, strided_parents)
from test_conv1d_verify_gpu import _launch as _launch_verify  # noqa: E402
from test_verify_gpu import TORCH_DTYPES, _runtime  # noqa: E402

# Packed layouts (cu_seqlens over one row), each sequence start placed against the 64-token blocks:
# - "crossing": sequences that start 1..3 before or after a block boundary (or on it) and run past the next one;
# - "short": empty sequences first, in the middle and last; sequences of 1..3 tokens (those shorter than K-1 end
#   with the tail of their initial window) in the last K-2 positions of a block (their first outputs lie in the
#   next block but are computed by this one) and right after a boundary.
LAYOUTS = {
    "crossing": [0, 61, 127, 193, 254, 259, 322, 383, 400],
    "short": [0, 0, 2, 61, 62, 63, 64, 64, 65, 66, 67, 125, 126, 127, 128, 131, 190, 254, 256, 257, 258, 260, 260],
}


def _launch(case, out, **extra):
    _runtime().launch("conv1d_fwd", out=out, **case.kwargs(), **extra)


def _case(*, batch=1, L=200, channels=200, K=4, bias=True, activation="silu", pool="bf16", num_slots=12, seed=0):
    """A conv1d_fwd problem as a :class:`ConvCase` whose T rows are the L prefill tokens (the same layer weights
    as conv1d_verify's cases of that (channels, K)); ``case.pool`` holds random windows to start from."""
    return ConvCase(batch=batch, T=L, channels=channels, K=K, bias=bias, activation=activation, pool=pool,
                    num_slots=num_slots, seed=seed)


def _oracle(case, initial=None, xBC=None, **packing):
    """``reference.conv1d_prefill`` on the case's (or the given) rows; packing: seq_idx / cu_seqlens."""
    return reference.conv1d_prefill(
        (case.xBC if xBC is None else xBC).cpu(), case.weight.cpu(), None if case.bias is None else case.bias.cpu(),
        case.activation, initial_conv_states=None if initial is None else initial.cpu(),
        **{k: v.cpu() for k, v in packing.items()})


def _gather(pool, indices):
    """The initial window each sequence reads: its slot of ``pool``, zeros for a slot < 0 or >= num_slots."""
    pool = pool.cpu().double()
    return torch.stack([pool[i] if 0 <= i < pool.shape[0] else torch.zeros_like(pool[0]) for i in indices])


def _cu(starts):
    return torch.tensor(starts, dtype=torch.int32, device="cuda")


def _states(case, num_seqs):
    """A (num_seqs, channels, K-1) final-state array in the case's pool dtype, NaN until written."""
    channels, K = case.weight.shape
    return torch.full((num_seqs, channels, K - 1), float("nan"), dtype=case.pool_dtype, device="cuda")


def _assert_windows(actual, expected, pool_dtype, what="final windows"):
    """Final windows are raw values: exactly the oracle's once rounded to the pool dtype (no tolerance)."""
    expected = expected.to(pool_dtype).double()
    actual = actual.cpu().double()
    if not torch.equal(actual, expected):
        bad = torch.nonzero(actual != expected)
        where = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {len(bad)} values differ from the oracle's, first at {where}: "
                             f"{actual[where].item()} vs {expected[where].item()}")


def _inputs_unchanged(before, after):
    assert all(_same_bits(a, b) for a, b in zip(before, after)), "an input was written"


# (K, conv_bias, activation, channels): every width, both options, channels off and on a CTA multiple
CONV_CASES = [(2, True, "silu", 200), (3, False, None, 200), (4, True, None, NEMOTRON_H_CHANNELS),
              (4, False, "silu", NEMOTRON_H_CHANNELS), (4, True, "silu", 200)]


@pytest.mark.parametrize("K,bias,activation,channels", CONV_CASES)
@pytest.mark.parametrize("L", [1, 3, 63, 64, 65, 200])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_rows_match_oracle(pool, L, K, bias, activation, channels):
    """One sequence per row (batch 3), L off and on the 64-token blocks, initial and final windows as
    (batch, channels, K-1) arrays in the pool dtype."""
    case = _case(batch=3, L=L, channels=channels, K=K, bias=bias, activation=activation, pool=pool, seed=L)
    initial = case.pool[:3].clone()
    final = _states(case, 3)
    before = [t.clone() for t in case.inputs() + [initial]]
    out = case.out()
    _launch(case, out, initial_states=initial, final_states=final)
    torch.cuda.synchronize()

    ref = _oracle(case, initial)
    _assert_out(out, ref["out"])
    _assert_windows(final, ref["final_conv_states"], case.pool_dtype)
    _inputs_unchanged(case.inputs() + [initial], before)


@pytest.mark.parametrize("states", ["none", "initial", "final"])
@pytest.mark.parametrize("L", [2, 100])
def test_optional_states(states, L):
    """Without initial states every sequence starts from a zero window (so a final window of a sequence
    shorter than K-1 is zero-padded); without final states nothing else is written."""
    case = _case(batch=2, L=L, K=4, pool="fp32", seed=3)
    initial = case.pool[:2].clone() if states == "initial" else None
    final = _states(case, 2) if states == "final" else None
    out = case.out()
    _launch(case, out, initial_states=initial, final_states=final)
    torch.cuda.synchronize()
    ref = _oracle(case, initial)
    _assert_out(out, ref["out"])
    if final is not None:
        _assert_windows(final, ref["final_conv_states"], case.pool_dtype)
        if L < 3:
            assert torch.all(final[:, :, :3 - L] == 0), "no initial window: the final window's head is zeros"


def _packed_case(layout, *, K, channels, pool, num_slots=0, seed=0):
    starts = LAYOUTS[layout]
    num_seqs = len(starts) - 1
    case = _case(L=starts[-1], channels=channels, K=K, pool=pool, num_slots=max(num_slots, num_seqs), seed=seed)
    return case, _cu(starts), num_seqs


def _pool_indices(num_seqs, num_slots, seed, bad):
    """Distinct slots for the sequences, with ``bad`` (position -> slot) overriding some: negative or out of
    range."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=gen)[:num_seqs].tolist()
    for position, slot in bad.items():
        slots[position] = slot
    return slots


PACKED_CASES = [(2, 200), (3, 200), (4, 200), (4, NEMOTRON_H_CHANNELS)]


@pytest.mark.parametrize("K,channels", PACKED_CASES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_packed_sequences_with_state_arrays(pool, layout, K, channels):
    """cu_seqlens packing, initial and final windows as (num_seqs, channels, K-1) arrays."""
    case, cu, num_seqs = _packed_case(layout, K=K, channels=channels, pool=pool, seed=K)
    initial = case.pool[:num_seqs].clone()
    final = _states(case, num_seqs)
    before = [t.clone() for t in case.inputs() + [initial, cu]]
    out = case.out()
    _launch(case, out, cu_seqlens=cu, initial_states=initial, final_states=final)
    torch.cuda.synchronize()

    ref = _oracle(case, initial, cu_seqlens=cu)
    _assert_out(out, ref["out"])
    _assert_windows(final, ref["final_conv_states"], case.pool_dtype)
    _inputs_unchanged(case.inputs() + [initial, cu], before)


@pytest.mark.parametrize("K,channels", PACKED_CASES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_packed_sequences_with_pools_and_out_of_range_slots(pool, layout, K, channels):
    """Initial windows read from one pool and final windows written to another, by slot: a negative or
    out-of-range initial slot reads zeros, a negative or out-of-range final slot writes nothing, and every slot
    not named keeps its bytes."""
    num_slots = 32
    case, cu, num_seqs = _packed_case(layout, K=K, channels=channels, pool=pool, num_slots=num_slots, seed=K + 1)
    read = _pool_indices(num_seqs, num_slots, 1, {1: -1, 3: num_slots, 5: INT32_MIN, num_seqs - 1: INT32_MAX})
    write = _pool_indices(num_seqs, num_slots, 2, {2: -1, 4: INT32_MAX, 6: num_slots, 7: INT32_MIN})
    initial_pool = case.pool.clone()
    final_pool = _case(channels=channels, K=K, pool=pool, num_slots=num_slots, seed=99).pool
    final_before = final_pool.clone()
    read_idx, write_idx = _index(read), _index(write)
    before = [t.clone() for t in case.inputs() + [initial_pool, cu, read_idx, write_idx]]
    out = case.out()
    _launch(case, out, cu_seqlens=cu, initial_states=initial_pool, initial_state_indices=read_idx,
            final_states=final_pool, final_state_indices=write_idx)
    torch.cuda.synchronize()

    ref = _oracle(case, _gather(initial_pool, read), cu_seqlens=cu)
    _assert_out(out, ref["out"])
    written = [(i, s) for i, s in enumerate(write) if 0 <= s < num_slots]
    _assert_windows(final_pool[[s for _, s in written]], ref["final_conv_states"][[i for i, _ in written]],
                    case.pool_dtype)
    _assert_untouched(final_before, final_pool, touched=[s for _, s in written])
    _inputs_unchanged(case.inputs() + [initial_pool, cu, read_idx, write_idx], before)


def test_empty_and_short_sequences_keep_their_initial_windows():
    """The explicit form of what the oracle comparisons imply (K = 4): an empty sequence's final window is its
    initial window, byte for byte (first, middle and last sequence); a sequence of n < 3 tokens ends with the
    last 3 - n values of its initial window followed by its n inputs."""
    case, cu, num_seqs = _packed_case("short", K=4, channels=200, pool="bf16", seed=5)
    starts = LAYOUTS["short"]
    initial = case.pool[:num_seqs].clone()
    final = _states(case, num_seqs)
    _launch(case, case.out(), cu_seqlens=cu, initial_states=initial, final_states=final)
    torch.cuda.synchronize()
    empty = [i for i in range(num_seqs) if starts[i] == starts[i + 1]]
    assert empty == [0, 6, num_seqs - 1]
    for i in empty:
        assert _same_bits(final[i], initial[i]), f"empty sequence {i}: final window != initial window"
    for i in range(num_seqs):
        n = starts[i + 1] - starts[i]
        if 0 < n < 3:
            expected = torch.cat([initial[i, :, n:], case.xBC[0, starts[i]:starts[i + 1]].t().to(initial.dtype)], 1)
            assert _same_bits(final[i], expected), f"sequence {i} of {n} tokens: final window"


@pytest.mark.parametrize("K", [2, 3, 4])
def test_seq_idx_matches_oracle_and_cu_seqlens(K):
    """seq_idx (batch 2, no states): a new sequence wherever the value changes (values with gaps: only changes
    count), each from a zero window. Per row, the same bits as the same sequences packed with cu_seqlens; an
    all-zero seq_idx gives the bits of a plain call."""
    L = 260
    changes = [[2, 61, 62, 64, 66, 127, 129, 190, 255, 258], [1, 63, 65, 67, 128, 131, 191, 192, 257]]
    case = _case(batch=2, L=L, K=K, seed=7)
    seq_idx = torch.zeros(2, L, dtype=torch.int32)
    for row, points in enumerate(changes):
        for n, p in enumerate(points):
            seq_idx[row, p:] = 3 * (n + 1) + row
    seq_idx = seq_idx.cuda()
    before = [t.clone() for t in case.inputs() + [seq_idx]]
    out = case.out()
    _launch(case, out, seq_idx=seq_idx)
    torch.cuda.synchronize()
    _assert_out(out, _oracle(case, seq_idx=seq_idx)["out"])
    _inputs_unchanged(case.inputs() + [seq_idx], before)

    for row, points in enumerate(changes):
        packed = case.out(rows=L)[:1]
        _runtime().launch("conv1d_fwd", out=packed, **case.kwargs(xBC=case.xBC[row:row + 1]),
                          cu_seqlens=_cu([0, *points, L]))
        torch.cuda.synchronize()
        assert _same_bits(packed[0], out[row]), f"row {row}: seq_idx and cu_seqlens differ"

    plain, zeros = case.out(), case.out()
    _launch(case, plain)
    _launch(case, zeros, seq_idx=torch.zeros(2, L, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert _same_bits(plain, zeros)


@pytest.mark.parametrize("packing", ["rows", "cu_seqlens"])
@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_pool_in_place_with_permuted_slots(pool, K, packing):
    """One pool passed as initial_states and final_states: each sequence reads its slot and writes its final
    window to a slot that no other sequence reads (its own, in permuted order, or a free one); a negative or
    out-of-range read slot starts from zeros; a negative or out-of-range write slot writes nothing. Short and
    empty sequences (whose final window re-reads the slot being overwritten) included."""
    num_slots = 32
    if packing == "rows":
        case = _case(batch=4, L=130, K=K, pool=pool, num_slots=num_slots, seed=11)
        num_seqs, extra, sequences = 4, {}, None
        read, write = [7, 30, -1, num_slots], [7, 30, 12, -1]
    else:
        case, cu, num_seqs = _packed_case("short", K=K, channels=200, pool=pool, num_slots=num_slots, seed=12)
        extra, sequences = {"cu_seqlens": cu}, {"cu_seqlens": cu}
        read = _pool_indices(num_seqs, num_slots, 3, {4: -1, 9: num_slots})
        free = [s for s in range(num_slots) if s not in read]
        write = list(read)   # its own slot, in the permuted order of `read` ...
        write[4], write[9], write[2], write[11] = free[0], free[1], -1, num_slots   # ... a free slot, or none
    pool_gpu = case.pool.clone()
    before = case.pool.clone()
    read_idx, write_idx = _index(read), _index(write)
    out = case.out()
    _launch(case, out, initial_states=pool_gpu, initial_state_indices=read_idx, final_states=pool_gpu,
            final_state_indices=write_idx, **extra)
    torch.cuda.synchronize()

    ref = _oracle(case, _gather(before, read), **(sequences or {}))
    _assert_out(out, ref["out"])
    written = [(i, s) for i, s in enumerate(write) if 0 <= s < num_slots]
    assert len({s for _, s in written}) == len(written)
    _assert_windows(pool_gpu[[s for _, s in written]], ref["final_conv_states"][[i for i, _ in written]],
                    case.pool_dtype)
    _assert_untouched(before, pool_gpu, touched=[s for _, s in written])


@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_state_array_in_place_without_indices(pool):
    """One (num_seqs, channels, K-1) array passed as initial_states and final_states: each sequence's window is
    read and overwritten in its own row (empty and short sequences included)."""
    case, cu, num_seqs = _packed_case("short", K=4, channels=200, pool=pool, seed=31)
    states = case.pool[:num_seqs].clone()
    before = states.clone()
    out = case.out()
    _launch(case, out, cu_seqlens=cu, initial_states=states, final_states=states)
    torch.cuda.synchronize()
    ref = _oracle(case, before, cu_seqlens=cu)
    _assert_out(out, ref["out"])
    _assert_windows(states, ref["final_conv_states"], case.pool_dtype)


@pytest.mark.parametrize("packing", ["rows", "cu_seqlens"])
def test_strided_views_equal_contiguous_bitwise(packing):
    """xBC as a column slice of a fused projection, out inside a wider buffer, a transposed weight, a pool with
    gaps between slots and taps, strided index and cu_seqlens arrays: the same bits as contiguous arrays, and
    nothing written into the gaps."""
    K, channels, num_slots = 4, 200, 40
    if packing == "rows":
        case = _case(batch=3, L=130, K=K, channels=channels, num_slots=num_slots, seed=13)
        num_seqs, cu = 3, None
    else:
        case, cu, num_seqs = _packed_case("short", K=K, channels=channels, pool="bf16", num_slots=num_slots,
                                          seed=13)
    batch, L, _ = case.xBC.shape
    slots = _pool_indices(num_seqs, num_slots, 4, {1: -1})
    idx = _index(slots)
    pool_ref, out_ref = case.pool.clone(), case.out()
    _launch(case, out_ref, initial_states=pool_ref, initial_state_indices=idx, final_states=pool_ref,
            final_state_indices=idx, **({} if cu is None else {"cu_seqlens": cu}))

    fused, pool_big, out_big, weight_t = strided_parents(case)
    idx_big = torch.full((num_seqs, 3), 77, dtype=torch.int32, device="cuda")
    idx_big[:, 1] = idx
    extra = {}
    if cu is not None:
        cu_big = torch.full((cu.shape[0], 2), -5, dtype=torch.int32, device="cuda")
        cu_big[:, 0] = cu
        extra["cu_seqlens"] = cu_big[:, 0]
    guard = (fused.clone(), pool_big.clone(), out_big.clone())
    pool_view, out_view = pool_big[::2, :, 1:], out_big[..., :channels]
    _runtime().launch("conv1d_fwd", xBC=fused[..., channels:2 * channels], conv_weight=weight_t.t(),
                      conv_bias=case.bias, activation=case.activation, out=out_view, initial_states=pool_view,
                      initial_state_indices=idx_big[:, 1], final_states=pool_view,
                      final_state_indices=idx_big[:, 1], **extra)
    torch.cuda.synchronize()
    assert _same_bits(out_view, out_ref) and _same_bits(pool_view, pool_ref)
    assert _same_bits(fused, guard[0]), "xBC's projection was written"
    assert _same_bits(pool_big[1::2], guard[1][1::2]) and _same_bits(pool_big[::2, :, 0], guard[1][::2, :, 0]), \
        "the pool's gaps were written"
    assert _same_bits(out_big[..., channels:], guard[2][..., channels:]), "out's gap was written"


def test_offsets_past_2_to_the_31_elements():
    """xBC as a column slice of a projection whose batch stride passes 2^31 elements, and a conv pool whose last
    slot starts past 2^31 elements (64-bit offsets, BRIEF §5): the same bits as contiguous arrays."""
    K, channels, L, batch = 4, 200, 70, 2
    case = _case(batch=batch, L=L, K=K, channels=channels, pool="bf16", num_slots=4, seed=29)
    read, write = _index([3, 0]), _index([3, 2])   # sequence 0 in place in the far slot; 1 into a free slot
    pool_ref, out_ref = case.pool.clone(), case.out()
    _launch(case, out_ref, initial_states=pool_ref, initial_state_indices=read, final_states=pool_ref,
            final_state_indices=write)

    row_stride = 2 * channels + 8
    batch_stride = (2**31 // row_stride + 1) * row_stride
    assert batch_stride > 2**31
    rows = torch.zeros(batch_stride + L * row_stride, dtype=torch.bfloat16, device="cuda")
    xBC = rows.as_strided((batch, L, channels), (batch_stride, row_stride, 1), channels)
    xBC.copy_(case.xBC)
    slot_stride = 2**31 // 3 + 64
    assert 3 * slot_stride > 2**31
    slots = torch.zeros(3 * slot_stride + channels * (K - 1), dtype=torch.bfloat16, device="cuda")
    pool = slots.as_strided((4, channels, K - 1), (slot_stride, K - 1, 1))
    pool.copy_(case.pool)
    out = case.out()
    _runtime().launch("conv1d_fwd", xBC=xBC, conv_weight=case.weight, conv_bias=case.bias,
                      activation=case.activation, out=out, initial_states=pool, initial_state_indices=read,
                      final_states=pool, final_state_indices=write)
    torch.cuda.synchronize()
    assert _same_bits(out, out_ref) and _same_bits(pool, pool_ref)
    ref = _oracle(case, _gather(case.pool, [3, 0]))
    _assert_out(out, ref["out"])
    _assert_windows(pool[[3, 2]], ref["final_conv_states"], case.pool_dtype)


def test_rows_outside_every_sequence_are_zero():
    """cu_seqlens need not cover the row: tokens before cu_seqlens[0] and after cu_seqlens[-1] belong to no
    sequence, and their outputs are written as zeros (so ssd_fwd can read them; the sequences themselves match
    the oracle)."""
    K, L = 4, 200
    starts = [10, 62, 62, 130, 150]
    case = _case(L=L, K=K, pool="fp32", seed=17)
    out = case.out()
    initial = case.pool[:len(starts) - 1].clone()
    final = _states(case, len(starts) - 1)
    _launch(case, out, cu_seqlens=_cu(starts), initial_states=initial, final_states=final)
    torch.cuda.synchronize()
    assert torch.all(out[:, :starts[0]] == 0), "rows before cu_seqlens[0] must be zero"
    assert torch.all(out[:, starts[-1]:] == 0), "rows after cu_seqlens[-1] must be zero"
    inner = case.xBC[:, starts[0]:starts[-1]]
    ref = _oracle(case, initial, xBC=inner, cu_seqlens=_cu([s - starts[0] for s in starts]))
    _assert_out(out[:, starts[0]:starts[-1]], ref["out"])
    _assert_windows(final, ref["final_conv_states"], case.pool_dtype)


def test_repeated_launches_are_bitwise_equal_and_leave_inputs_unchanged():
    """The same packed in-place call twice on the same buffers, reset in between (the second takes the runtime's
    memoised path): the same bits, no NaN / Inf, and nothing the kernel only reads is written."""
    num_slots = 32
    case, cu, num_seqs = _packed_case("short", K=4, channels=NEMOTRON_H_CHANNELS, pool="fp32",
                                      num_slots=num_slots, seed=19)
    idx = _index(_pool_indices(num_seqs, num_slots, 5, {3: -1}))
    reads = case.inputs() + [cu, idx]
    before = [t.clone() for t in reads]
    pool_gpu, out = case.pool.clone(), case.out()
    results = []
    for _ in range(2):
        pool_gpu.copy_(case.pool)
        out.fill_(float("nan"))
        _launch(case, out, cu_seqlens=cu, initial_states=pool_gpu, initial_state_indices=idx,
                final_states=pool_gpu, final_state_indices=idx)
        torch.cuda.synchronize()
        results.append((out.clone(), pool_gpu.clone()))
    _inputs_unchanged(reads, before)
    assert all(_same_bits(a, b) for a, b in zip(*results))
    assert bool(torch.isfinite(results[0][0]).all()) and bool(torch.isfinite(results[0][1]).all()), "NaN / Inf"


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_prefill_into_a_pool_then_verify_update_equals_one_prefill(pool, K):
    """conv1d_fwd prefills packed sequences (one empty, one shorter than K-1) from their slots of a conv pool and
    leaves their final windows there, in place; conv1d_verify (update) then runs T more tokens per sequence from
    those slots. Prefill and decode outputs match one conv1d_prefill over each whole sequence, and the pool ends
    holding that run's final windows, exactly."""
    lengths, T, num_slots = [70, 0, 2, 131], 3, 8
    slots = [5, 0, 3, 6]
    full = [n + T for n in lengths]
    full_starts = [0] + torch.tensor(full).cumsum(0).tolist()
    case = _case(L=full_starts[-1], K=K, pool=pool, num_slots=num_slots, seed=23)
    rows = case.xBC[0]
    prefill = torch.cat([rows[s:s + n] for s, n in zip(full_starts, lengths)])[None]
    decode = torch.stack([rows[s + n:s + n + T] for s, n in zip(full_starts, lengths)])
    prefill_starts = [0] + torch.tensor(lengths).cumsum(0).tolist()
    before = case.pool.clone()
    pool_gpu, idx = case.pool.clone(), _index(slots)

    out_prefill = case.out(rows=prefill.shape[1])[:1]
    _runtime().launch("conv1d_fwd", out=out_prefill, **case.kwargs(xBC=prefill), cu_seqlens=_cu(prefill_starts),
                      initial_states=pool_gpu, initial_state_indices=idx, final_states=pool_gpu,
                      final_state_indices=idx)
    out_decode = torch.full(decode.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    _launch_verify("update", case, pool_gpu, out_decode, idx, xBC=decode)
    torch.cuda.synchronize()

    ref = _oracle(case, _gather(before, slots), cu_seqlens=_cu(full_starts))
    expected_prefill = torch.cat([ref["out"][0, s:s + n] for s, n in zip(full_starts, lengths)])[None]
    expected_decode = torch.stack([ref["out"][0, s + n:s + n + T] for s, n in zip(full_starts, lengths)])
    _assert_out(out_prefill, expected_prefill, "prefill out")
    _assert_out(out_decode, expected_decode, "decoded out")
    _assert_windows(pool_gpu[slots], ref["final_conv_states"], TORCH_DTYPES[pool], "windows after decode")
    _assert_untouched(before, pool_gpu, touched=slots)
