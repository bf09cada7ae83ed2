"""conv1d_verify on the GPU: the causal conv1d on a conv-state pool in update / snapshot / compact replay mode,
against the fp64 oracle (tests/reference/conv.py) and against each other.

Needs a CUDA device and the conv1d_verify cubins (the ci build: bf16 rows on a bf16 or an fp32 pool); see
tests/conftest.py. The conv state is raw inputs, moved without rounding, so pools and window records are
compared exactly; the outputs are one fp32 sum rounded to bf16 (:func:`_assert_out`).
"""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from test_verify_gpu import TORCH_DTYPES, _runtime  # noqa: E402

INT32_MAX, INT32_MIN = 2**31 - 1, -2**31
NEMOTRON_H_CHANNELS = 128 * 64 + 2 * 8 * 128   # H128 P64 G8 N128: x, B and C through one conv (10240)


def _assert_out(actual, expected, name="out"):
    """Conv outputs against the oracle: the shared check (NaN / Inf first, scaled error within the bf16 output
    bound), then, since only the final rounding of an fp32 sum of K products separates the kernel from the
    fp64 oracle, every element within half a bf16 ulp of it (2^-8 relative) plus fp32 slack."""
    actual = actual.cpu()
    reference.assert_close_scaled(actual, expected, reference.TOLERANCES["bf16"]["out"], name)
    bad = (actual.double() - expected).abs() > 2.0**-8 * expected.abs() + 1e-5
    if bool(bad.any()):
        where = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} elements beyond half a bf16 ulp of the oracle, first at "
                             f"{where}: {actual[where].item()} vs {expected[where].item()}")


def _bits(t):
    """The raw bits of ``t``: comparing them is a byte comparison (-0.0 != 0.0, NaN == NaN)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _assert_untouched(before, after, touched, what="slots"):
    """Every slot of ``after`` not in ``touched`` holds ``before``'s bytes."""
    keep = [s for s in range(before.shape[0]) if s not in set(touched)]
    assert _same_bits(after[keep], before[keep]), f"{what} not named by the call must keep their bytes"


def strided_parents(case):
    """Larger buffers to cut the case's arrays from as strided views: xBC as the middle columns of a fused
    projection (``[..., ch:2ch]``), the pool as every other slot without its first tap (``[::2, :, 1:]``), out as
    the first columns of a wider buffer (``[..., :ch]``), and the weight transposed (its ``.t()`` is a
    (channels, K) view with strides (1, channels)). Returns (fused, pool_big, out_big, weight_t)."""
    batch, rows, channels = case.xBC.shape
    num_slots, _, taps = case.pool.shape
    fused = torch.randn(batch, rows, 2 * channels + 24, device="cuda").to(torch.bfloat16)
    fused[..., channels:2 * channels] = case.xBC
    pool_big = torch.randn(2 * num_slots, channels, taps + 1, device="cuda").to(case.pool.dtype)
    pool_big[::2, :, 1:] = case.pool
    out_big = torch.randn(batch, rows, channels + 8, device="cuda").to(torch.bfloat16)
    return fused, pool_big, out_big, case.weight.t().contiguous()


class ConvCase:
    """One conv1d_verify problem: a layer's conv weights (fixed by (channels, K), so every call of a scripted
    sequence runs the same layer), bf16 rows of xBC and a pool of random windows (both from ``seed``)."""

    def __init__(self, *, batch=4, T=1, channels=200, K=4, bias=True, activation="silu", pool="bf16",
                 num_slots=12, seed=0):
        layer = torch.Generator().manual_seed(1000 * K + channels)
        bound = K ** -0.5   # torch.nn.Conv1d's default init range for a depthwise conv of width K
        self.weight = ((2 * torch.rand(channels, K, generator=layer) - 1) * bound).cuda()
        self.bias = ((2 * torch.rand(channels, generator=layer) - 1) * bound).cuda() if bias else None
        gen = torch.Generator().manual_seed(seed)
        self.xBC = torch.randn(batch, T, channels, generator=gen).to(torch.bfloat16).cuda()
        self.pool = torch.randn(num_slots, channels, K - 1, generator=gen).to(TORCH_DTYPES[pool]).cuda()
        self.activation = activation
        self.pool_dtype = TORCH_DTYPES[pool]

    def kwargs(self, xBC=None):
        return {"xBC": self.xBC if xBC is None else xBC, "conv_weight": self.weight, "conv_bias": self.bias,
                "activation": self.activation}

    def out(self, rows=None):
        batch, T, channels = self.xBC.shape
        return torch.full((batch, T if rows is None else rows, channels), float("nan"), dtype=torch.bfloat16,
                          device="cuda")

    def inputs(self):
        """The arrays the kernel only reads (to check they are never written)."""
        return [t for t in (self.xBC, self.weight, self.bias) if t is not None]

    def oracle_args(self):
        return {"xBC": self.xBC.cpu(), "weight": self.weight.cpu(),
                "bias": None if self.bias is None else self.bias.cpu(), "activation": self.activation,
                "pool_dtype": self.pool_dtype}


def _launch(mode, case, pool, out, state_indices, xBC=None, **extra):
    _runtime().launch("conv1d_verify", mode=mode, conv_state=pool, out=out, state_indices=state_indices,
                      **case.kwargs(xBC), **extra)


def _index(rows):
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def _window(num_slots, capacity, channels, *, pending=None, seed=0):
    """A compact-mode window record and its tickets. Fresh: all zeros; with ``pending`` (slot -> count), those
    slots hold ``count`` pending rows (and every row of every slot random bits, so stale rows show)."""
    window = {"conv_window_count": torch.zeros(num_slots, dtype=torch.int32, device="cuda"),
              "conv_window_xBC": torch.zeros(num_slots, capacity, channels, dtype=torch.bfloat16, device="cuda"),
              "tickets": torch.zeros(num_slots, dtype=torch.int32, device="cuda")}
    if pending is not None:
        gen = torch.Generator().manual_seed(seed + 5)
        window["conv_window_xBC"].copy_(torch.randn(num_slots, capacity, channels, generator=gen))
        for slot, count in pending.items():
            window["conv_window_count"][slot] = count
    return window


def _oracle_window(window):
    return reference.WindowRecord(window["conv_window_count"].cpu().long(),
                                  {"xBC": window["conv_window_xBC"].cpu().double()})


def _counter():
    return torch.zeros(1, dtype=torch.int32, device="cuda")


# (K, conv_bias, activation, channels, T): every width, both options, channels off and on a CTA multiple
UPDATE_CASES = [(2, True, "silu", 200, 1), (3, False, None, 200, 3), (4, True, None, NEMOTRON_H_CHANNELS, 1),
                (4, False, "silu", NEMOTRON_H_CHANNELS, 4)]


@pytest.mark.parametrize("K,bias,activation,channels,T", UPDATE_CASES)
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_update_matches_oracle(pool, K, bias, activation, channels, T):
    case = ConvCase(T=T, channels=channels, K=K, bias=bias, activation=activation, pool=pool)
    idx = _index([3, -1, 11, 12])  # valid, padding, the last slot, out of range (num_slots = 12)
    rejected = _counter()
    before = [t.clone() for t in case.inputs() + [idx]]
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("update", case, pool_gpu, out, idx, rejected=rejected)
    torch.cuda.synchronize()

    ref = reference.conv1d_update(case.pool.cpu(), idx.cpu(), **case.oracle_args())
    _assert_out(out, ref.out)
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0), "padding and out-of-range rows output zero"
    assert torch.equal(pool_gpu.cpu().double(), ref.pool), "the conv state is raw inputs: the oracle's, exactly"
    _assert_untouched(case.pool, pool_gpu, touched=[3, 11])
    assert rejected.item() == int(ref.out_of_range.sum()) == 1, "one out-of-range slot"
    assert all(_same_bits(a, b) for a, b in zip(case.inputs() + [idx], before)), "an input was written"


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_snapshot_matches_oracle(pool, K):
    case = ConvCase(T=4, K=K, pool=pool, num_slots=24)
    idx = _index([0, 1, -1, 2])
    # row 1's last target is out of range (skipped, counted); the padding row's targets are never written;
    # row 3 snapshots into its own source slot after row 1 (the window was read once: later rows unaffected)
    snaps = _index([[4, 5, -1, 6], [7, 8, 9, 24], [10, 11, 12, 13], [14, 2, 15, 16]])
    rejected = _counter()
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("snapshot", case, pool_gpu, out, idx, snapshot_indices=snaps, rejected=rejected)
    torch.cuda.synchronize()

    ref = reference.conv1d_snapshot(case.pool.cpu(), idx.cpu(), snapshot_indices=snaps.cpu(), **case.oracle_args())
    _assert_out(out, ref.out)
    assert torch.all(out[2] == 0), "the padding row outputs zero"
    assert torch.equal(pool_gpu.cpu().double(), ref.pool), "snapshots are the oracle's windows, exactly"
    _assert_untouched(case.pool, pool_gpu, touched=[4, 5, 6, 7, 8, 9, 2, 14, 15, 16])
    assert rejected.item() == 1, "one out-of-range snapshot index"


@pytest.mark.parametrize("K,T", [(2, 3), (4, 3), (4, 0)])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_compact_matches_oracle(pool, K, T):
    """One call on a window record holding pending rows: fold (clamped where asked too much or too little), run
    the new rows, keep them as the pending window. T = 0 is a commit: it folds and empties the windows."""
    capacity, num_slots = 4, 8
    case = ConvCase(batch=5, T=T, K=K, pool=pool, num_slots=num_slots)
    window = _window(num_slots, capacity, 200, pending={0: 3, 1: 2, 2: 4, 5: 1, 7: 4})
    before = {k: v.clone() for k, v in window.items()}
    idx = _index([0, 1, -1, 2, num_slots])
    num_accepted = _index([2, 3, 1, -1, 0])   # row 1 asks 3 of 2 (-> 2), row 3 asks -1 (-> 0): both counted
    rejected = _counter()
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("compact", case, pool_gpu, out, idx, num_accepted=num_accepted, rejected=rejected, **window)
    torch.cuda.synchronize()

    ref = reference.conv1d_compact(case.pool.cpu(), _oracle_window(before), idx.cpu(), num_accepted=num_accepted.cpu(),
                                   **case.oracle_args())
    _assert_out(out, ref.out)
    assert torch.all(out[2] == 0) and torch.all(out[4] == 0), "padding and out-of-range rows output zero"
    assert torch.equal(pool_gpu.cpu().double(), ref.pool), "committed windows are the oracle's, exactly"
    _assert_untouched(case.pool, pool_gpu, touched=[0, 1])   # slot 2 folds nothing (num_accepted clamped to 0)
    assert torch.equal(window["conv_window_count"].cpu().long(), ref.window.count)
    for b, slot in ((0, 0), (1, 1), (3, 2)):
        assert _same_bits(window["conv_window_xBC"][slot, :T], case.xBC[b]), f"slot {slot}: pending rows"
    _assert_untouched(before["conv_window_xBC"], window["conv_window_xBC"], touched=[0, 1, 2], what="window rows")
    assert torch.all(window["tickets"] == 0), "every call leaves the tickets zero"
    assert rejected.item() == int(ref.out_of_range.sum() + ref.accepted_clamped.sum()) == 3


@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_out_of_range_indices_are_counted_and_never_touch_memory(pool):
    """Slots, snapshot targets and accepted counts at the int32 extremes: treated as padding, skipped or
    clamped, each counted once in ``rejected``; nothing outside the named slots changes."""
    num_slots = 8
    case = ConvCase(batch=5, T=3, pool=pool, num_slots=num_slots)
    idx = _index([INT32_MAX, num_slots, -1, INT32_MIN, 1])
    rejected, pool_gpu, out = _counter(), case.pool.clone(), case.out()
    _launch("update", case, pool_gpu, out, idx, rejected=rejected)
    torch.cuda.synchronize()
    assert rejected.item() == 2
    assert torch.all(out[:4] == 0)
    _assert_untouched(case.pool, pool_gpu, touched=[1])

    two = ConvCase(batch=2, T=3, pool=pool, num_slots=num_slots)
    snaps = _index([[num_slots, 5, INT32_MAX], [-1, INT32_MIN, 6]])
    rejected, pool_gpu = _counter(), two.pool.clone()
    _launch("snapshot", two, pool_gpu, two.out(), _index([0, 1]), snapshot_indices=snaps, rejected=rejected)
    torch.cuda.synchronize()
    assert rejected.item() == 2
    ref = reference.conv1d_snapshot(two.pool.cpu(), [0, 1], snapshot_indices=snaps.cpu(), **two.oracle_args())
    assert torch.equal(pool_gpu.cpu().double(), ref.pool)
    _assert_untouched(two.pool, pool_gpu, touched=[5, 6])

    four = ConvCase(batch=4, T=2, pool=pool, num_slots=num_slots)
    window = _window(num_slots, 4, 200, pending={s: 2 for s in range(4)})
    before = _oracle_window(window)
    num_accepted = _index([-1, 3, INT32_MAX, INT32_MIN])   # -> 0, 2, 2, 0
    rejected, pool_gpu = _counter(), four.pool.clone()
    _launch("compact", four, pool_gpu, four.out(), _index([0, 1, 2, 3]), num_accepted=num_accepted,
            rejected=rejected, **window)
    torch.cuda.synchronize()
    assert rejected.item() == 4
    ref = reference.conv1d_compact(four.pool.cpu(), before, [0, 1, 2, 3], num_accepted=num_accepted.cpu(),
                                   **four.oracle_args())
    assert torch.equal(pool_gpu.cpu().double(), ref.pool)
    _assert_untouched(four.pool, pool_gpu, touched=[1, 2])
    assert torch.all(window["tickets"] == 0)


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_compact_replay_equals_snapshot_bitwise(pool, K):
    """Scripted speculative decoding: per call T draft rows (1..capacity), then the caller accepts some of them;
    a padding row rides along. Compact mode's outputs and committed windows equal snapshot mode's, bit for bit,
    and every call leaves the tickets zero."""
    batch, channels, capacity = 3, 200, 4
    script = [(4, 3), (1, 0), (3, 2), (2, 0), (4, 0), (1, 1)]   # (T drafted, how many of them are accepted)
    num_slots = 2 + batch * capacity
    src = _index([0, -1, 1])      # committed windows in slots 0, 1; snapshot mode's per-row windows in 2..
    base = ConvCase(batch=batch, channels=channels, K=K, pool=pool, num_slots=num_slots)
    snap_pool, compact_pool = base.pool.clone(), base.pool.clone()
    window = _window(num_slots, capacity, channels)
    accepted_before = 0
    for call, (T, accepted) in enumerate(script + [(0, None)]):   # a last T = 0 call commits the last acceptance
        case = ConvCase(batch=batch, T=T, channels=channels, K=K, pool=pool, num_slots=num_slots, seed=100 + call)
        committed = snap_pool[:2].clone()   # snapshot mode's committed windows, which compact mode folds to now
        out_compact = case.out()
        _launch("compact", case, compact_pool, out_compact, src, **window,
                num_accepted=torch.full((batch,), accepted_before, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        assert torch.all(window["tickets"] == 0), f"call {call}: the tickets are not left zero"
        assert _same_bits(compact_pool[:2], committed), f"call {call}: committed windows differ"
        assert window["conv_window_count"].tolist() == [T, T] + [0] * (num_slots - 2), f"call {call}: counts"
        assert _same_bits(window["conv_window_xBC"][[0, 1], :T], case.xBC[[0, 2]]), f"call {call}: pending rows"
        if accepted is None:
            break
        snaps = _index([[2 + b * capacity + t for t in range(T)] for b in range(batch)])
        out_snap = case.out()
        _launch("snapshot", case, snap_pool, out_snap, src, snapshot_indices=snaps)
        torch.cuda.synchronize()
        assert _same_bits(out_snap, out_compact), f"call {call}: outputs differ"
        assert torch.all(out_compact[1] == 0), f"call {call}: the padding row outputs zero"
        if accepted > 0:   # commit: the next source is the window after the last accepted row
            snap_pool[:2] = snap_pool[snaps[[0, 2], accepted - 1].long()]
        accepted_before = accepted
    assert _same_bits(compact_pool[2:], base.pool[2:]), "compact mode writes no per-row windows"


@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_single_row_updates_equal_one_multi_row_update_bitwise(pool):
    T = 5
    case = ConvCase(T=T, K=4, pool=pool)
    idx = _index([0, 5, 2, 9])
    pool_multi, out_multi = case.pool.clone(), case.out()
    _launch("update", case, pool_multi, out_multi, idx)
    pool_single, out_single = case.pool.clone(), case.out()
    for t in range(T):
        _launch("update", case, pool_single, out_single[:, t:t + 1], idx, xBC=case.xBC[:, t:t + 1])
    torch.cuda.synchronize()
    assert _same_bits(out_multi, out_single)
    assert _same_bits(pool_multi, pool_single)


def _mode_extras(mode, batch, T, num_slots, channels):
    """The mode's own arguments for a call on slots 0..batch-1 (fresh arrays on every call)."""
    if mode == "snapshot":
        return {"snapshot_indices": _index([[batch + b * T + t for t in range(T)] for b in range(batch)])}
    if mode == "compact":
        return {"num_accepted": _index([1, 2, 0, 3][:batch]),
                **_window(num_slots, 4, channels, pending={s: 3 for s in range(batch)})}
    return {}


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_repeated_launches_are_bitwise_equal_and_leave_inputs_unchanged(mode):
    """The same call twice on the same buffers, reset in between (the second takes the runtime's memoised path)."""
    batch, T, num_slots = 4, 3, 20
    case = ConvCase(batch=batch, T=T, num_slots=num_slots)
    idx = _index(list(range(batch)))
    extras = _mode_extras(mode, batch, T, num_slots, 200)
    start = {k: v.clone() for k, v in extras.items()}
    reads = case.inputs() + [idx] + [v for k, v in extras.items() if k in ("snapshot_indices", "num_accepted")]
    before = [t.clone() for t in reads]
    pool_gpu, out = case.pool.clone(), case.out()
    results = []
    for _ in range(2):
        pool_gpu.copy_(case.pool)
        out.fill_(float("nan"))
        for k, v in extras.items():
            v.copy_(start[k])
        _launch(mode, case, pool_gpu, out, idx, **extras)
        torch.cuda.synchronize()
        results.append([t.clone() for t in [out, pool_gpu, *extras.values()]])
    assert all(_same_bits(a, b) for a, b in zip(reads, before)), "an input was written"
    assert all(_same_bits(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_strided_views_equal_contiguous_bitwise(mode):
    """xBC sliced out of a fused projection, a pool with gaps between slots and taps, a transposed weight, an
    output inside a wider buffer: the same bits as contiguous arrays, and nothing written into the gaps."""
    batch, T, channels, K, num_slots = 3, 3, 200, 4, 12
    case = ConvCase(batch=batch, T=T, channels=channels, K=K, num_slots=num_slots)
    idx = _index([2, 0, 1])
    extras = _mode_extras(mode, batch, T, num_slots, channels)
    ref_extras, strided_extras = ({k: v.clone() for k, v in extras.items()} for _ in range(2))
    pool_ref, out_ref = case.pool.clone(), case.out()
    _launch(mode, case, pool_ref, out_ref, idx, **ref_extras)

    fused, pool_big, out_big, weight_t = strided_parents(case)
    guard = (fused.clone(), pool_big.clone(), out_big.clone())
    pool_view, out_view = pool_big[::2, :, 1:], out_big[..., :channels]
    _runtime().launch("conv1d_verify", mode=mode, conv_state=pool_view, out=out_view, state_indices=idx,
                      xBC=fused[..., channels:2 * channels], conv_weight=weight_t.t(), conv_bias=case.bias,
                      activation=case.activation, **strided_extras)
    torch.cuda.synchronize()
    assert _same_bits(out_view, out_ref) and _same_bits(pool_view, pool_ref)
    assert all(_same_bits(strided_extras[k], ref_extras[k]) for k in extras), "window records differ"
    assert _same_bits(fused, guard[0]), "xBC's projection was written"
    assert _same_bits(pool_big[1::2], guard[1][1::2]) and _same_bits(pool_big[::2, :, 0], guard[1][::2, :, 0]), \
        "the pool's gaps were written"
    assert _same_bits(out_big[..., channels:], guard[2][..., channels:]), "out's gap was written"
