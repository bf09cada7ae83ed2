"""verify with the fused pre-conv on the GPU: a fused call (xBC, conv_state, conv_weight, ... instead of x, B, C)
equals the unfused pair conv1d_verify → verify (x, B, C as column views of the conv output) BITWISE: outputs, the
SSM pool, the conv pool, the SSM window record and the conv window record, the rejected count; compact replay
equals snapshot mode through a scripted speculative-decoding sequence; the Nemotron-H decode shape matches the fp64
oracle (reference.conv, rounded to bf16 as the conv hands its output on, then reference.verify).

Needs a CUDA device and the ci build's variants: verify (update / snapshot / compact, P 64 / 128, N 128, bf16 I/O,
fp32 / bf16 pool, conv_dtype bf16 and none) and conv1d_verify (bf16 I/O, bf16 pool); see tests/conftest.py.
Every fused call here also checks that the tickets are left zero and that no input was written.
"""
import copy
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from test_conv1d_verify_gpu import (NEMOTRON_H_CHANNELS, ConvCase, _assert_out,  # noqa: E402
                                    _assert_untouched, _counter, _index, _same_bits)
from test_conv1d_verify_gpu import _window as _conv_window  # noqa: E402
from test_verify_gpu import TORCH_DTYPES, Case, _runtime, _tolerances  # noqa: E402
from test_verify_gpu import _window as _ssm_window  # noqa: E402

SSM_WINDOW = ("window_count", "window_x", "window_B", "window_dt")
CONV_WINDOW = ("conv_window_count", "conv_window_xBC")
TEMPORAL = ("x", "dt", "B", "C", "z")   # Case.kwargs with a T dim


class FusedCase:
    """One fused problem: the SSM half is test_verify_gpu.Case (its x, B and C unused: the conv computes them),
    the conv half test_conv1d_verify_gpu.ConvCase over channels = H·P + 2·G·N; both with the same batch, T and
    seed, so a layer's parameters (A, D, dt_bias, conv weights) are the same on every call of a script."""

    def __init__(self, *, batch=4, T=3, H=4, P=64, N=128, G=2, K=4, conv_bias=True, activation="silu",
                 pool="fp32", conv_pool="bf16", num_slots=12, seed=0, D="H", z=True, dt_bias=True,
                 dt_softplus=True, dt_limit=(0.0, math.inf)):
        self.ssm = Case(batch=batch, T=T, H=H, P=P, N=N, G=G, io="bf16", pool=pool, num_slots=num_slots, seed=seed,
                        D=D, z=z, dt_bias=dt_bias, dt_limit=dt_limit)
        self.ssm.kwargs["dt_softplus"] = dt_softplus
        self.conv = ConvCase(batch=batch, T=T, channels=H * P + 2 * G * N, K=K, bias=conv_bias,
                             activation=activation, pool=conv_pool, num_slots=num_slots, seed=seed)
        self.H, self.P, self.N, self.G, self.num_slots = H, P, N, G, num_slots

    def gates(self):
        """The SSM arguments other than x, B and C (dt, A, D, z, dt_bias, dt_softplus, dt_limit)."""
        return {k: v for k, v in self.ssm.kwargs.items() if k not in ("x", "B", "C")}

    def inputs(self):
        """The tensors a call only reads."""
        return self.conv.inputs() + [v for v in self.gates().values() if isinstance(v, torch.Tensor)]

    def rows(self, start, stop):
        """This case restricted to rows start..stop (views of the same tensors)."""
        part = copy.copy(self)
        part.ssm, part.conv = copy.copy(self.ssm), copy.copy(self.conv)
        part.ssm.kwargs = {k: v[:, start:stop] if k in TEMPORAL else v for k, v in self.ssm.kwargs.items()}
        batch, _, H, P = self.ssm.shape
        part.ssm.shape = (batch, stop - start, H, P)
        part.conv.xBC = self.conv.xBC[:, start:stop]
        return part

    def split(self, xBC):
        """Mamba-2's [x | B | C] channel split of ``xBC`` (..., channels), as views."""
        HP, GN = self.H * self.P, self.G * self.N
        return (xBC[..., :HP].unflatten(-1, (self.H, self.P)), xBC[..., HP:HP + GN].unflatten(-1, (self.G, self.N)),
                xBC[..., HP + GN:].unflatten(-1, (self.G, self.N)))

    def start(self, mode, *, capacity=4, pending=None, seed=0):
        """The arrays a call writes, at their starting values: both pools, the tickets and in compact mode both
        window records. ``pending`` (slot -> count): those slots hold that many pending rows in both records
        (the same count, as the kernels leave them), every row of every slot random bits."""
        state = {"state": self.ssm.pool.clone(), "conv_state": self.conv.pool.clone()}
        channels = self.conv.xBC.shape[2]
        conv = _conv_window(self.num_slots, capacity, channels, pending=pending, seed=seed)
        state["tickets"] = conv.pop("tickets")   # conv1d_verify's (num_slots,); the fused call's (num_slots, G + 1)
        state["fused_tickets"] = torch.zeros(self.num_slots, self.G + 1, dtype=torch.int32, device="cuda")
        if mode == "compact":
            ssm = _ssm_window(self.num_slots, capacity, self.H, self.P, self.N, "bf16")
            if pending is not None:
                gen = torch.Generator().manual_seed(seed + 9)
                for key in ("window_x", "window_B", "window_dt"):
                    ssm[key].copy_(torch.randn(ssm[key].shape, generator=gen))
                for slot, count in pending.items():
                    ssm["window_count"][slot] = count
            state.update(ssm, **conv)
        return state


def _clone(arrays):
    return {k: v.clone() for k, v in arrays.items()}


def _assert_same(actual, expected, where):
    assert actual.keys() == expected.keys()
    for key in actual:
        assert _same_bits(actual[key], expected[key]), f"{where}: {key} differs"


def _reads(case, idx, extra):
    return case.inputs() + [idx] + [v for v in extra.values() if isinstance(v, torch.Tensor)]


def launch_fused(mode, case, state, idx, **extra):
    """The fused call on ``state`` (updated in place); returns (out, rejected count). Checks that the call left
    the tickets zero and wrote no input."""
    out, rejected = case.ssm.out(), _counter()
    reads = _reads(case, idx, extra)
    before = [t.clone() for t in reads]
    windows = {k: state[k] for k in SSM_WINDOW + CONV_WINDOW if k in state}
    _runtime().launch("verify", mode=mode, state=state["state"], out=out, state_indices=idx,
                      conv_state=state["conv_state"], tickets=state["fused_tickets"], rejected=rejected,
                      **case.conv.kwargs(), **case.gates(), **windows, **extra)
    torch.cuda.synchronize()
    assert torch.all(state["fused_tickets"] == 0), f"{mode}: the fused call left the tickets nonzero"
    assert all(_same_bits(a, b) for a, b in zip(reads, before)), f"{mode}: the fused call wrote an input"
    return out, rejected.item()


def launch_pair(mode, case, state, idx, **extra):
    """The unfused pair on ``state``: conv1d_verify, then verify on column views of its output; returns
    (out, rejected count of conv1d_verify, rejected count of verify)."""
    conv_out, conv_rejected, ssm_rejected = case.conv.out(), _counter(), _counter()
    conv_extra = {}
    if mode == "compact":
        conv_extra = {"tickets": state["tickets"], **{k: state[k] for k in CONV_WINDOW}}
    _runtime().launch("conv1d_verify", mode=mode, conv_state=state["conv_state"], out=conv_out, state_indices=idx,
                      rejected=conv_rejected, **case.conv.kwargs(), **conv_extra, **extra)
    x, B, C = case.split(conv_out)
    out = case.ssm.out()
    _runtime().launch("verify", mode=mode, state=state["state"], out=out, state_indices=idx, x=x, B=B, C=C,
                      rejected=ssm_rejected, **case.gates(), **{k: state[k] for k in SSM_WINDOW if k in state},
                      **extra)
    torch.cuda.synchronize()
    assert torch.all(state["tickets"] == 0), f"{mode}: the pair left the tickets nonzero"
    return out, conv_rejected.item(), ssm_rejected.item()


def _requests(mode, num_slots):
    """Four requests (a valid slot, a padding row, a valid slot, an out-of-range slot) and the mode's arguments:
    snapshot targets with a skipped one, an out-of-range one (counted) and one into the row's own source slot;
    pending windows (3 and 2 rows, and an unnamed slot's) with one row asking for more than is pending (clamped,
    counted). Returns (state_indices, extra, pending, slots the call writes, expected rejected count)."""
    idx = _index([0, -1, 5, num_slots])
    if mode == "snapshot":
        snaps = _index([[6, 7, -1], [8, 9, 10], [11, num_slots, 5], [1, 2, 3]])
        return idx, {"snapshot_indices": snaps}, None, [6, 7, 11, 5], 2
    if mode == "compact":
        return idx, {"num_accepted": _index([2, 1, 4, 0])}, {0: 3, 5: 2, 7: 1}, [0, 5], 2
    return idx, {}, None, [0, 5], 1


def _check_fused_equals_pair(mode, **case_options):
    T, num_slots = 3, 12
    case = FusedCase(batch=4, T=T, num_slots=num_slots, seed=11, **case_options)
    idx, extra, pending, touched, expected_rejected = _requests(mode, num_slots)
    start = case.start(mode, capacity=4, pending=pending, seed=3)
    fused, pair = _clone(start), _clone(start)
    out_fused, rejected = launch_fused(mode, case, fused, idx, **extra)
    out_pair, conv_rejected, ssm_rejected = launch_pair(mode, case, pair, idx, **extra)
    _assert_same({"out": out_fused, **fused}, {"out": out_pair, **pair}, f"{mode} fused vs pair")
    assert rejected == conv_rejected == ssm_rejected == expected_rejected
    assert torch.all(out_fused[1] == 0) and torch.all(out_fused[3] == 0), "padding and out-of-range rows output zero"
    for pool in ("state", "conv_state"):
        _assert_untouched(start[pool], fused[pool], touched, what=f"{pool} slots")
    if mode == "compact":
        assert fused["conv_window_count"].tolist() == [T, 0, 0, 0, 0, T, 0, 1, 0, 0, 0, 0]
        assert torch.all(fused["window_count"][[0, 5]] == T) and torch.all(fused["window_count"][7] == 1)
        for b, slot in ((0, 0), (2, 5)):
            assert _same_bits(fused["conv_window_xBC"][slot, :T], case.conv.xBC[b]), f"slot {slot}: pending rows"
            assert _same_bits(fused["conv_window_xBC"][slot, T:], start["conv_window_xBC"][slot, T:]), \
                f"slot {slot}: window rows past the count keep their bytes"
        for key in SSM_WINDOW + CONV_WINDOW:
            _assert_untouched(start[key], fused[key], [0, 5], what=f"{key} slots")


# (K, conv_bias, activation, D, z, dt_bias, dt_softplus, dt_limit): every width, both conv options, the SSM options
OPTIONS = [(2, True, "silu", "H", True, True, True, (0.0, math.inf)),
           (3, False, None, "HP", False, True, False, (1e-3, 0.2)),
           (4, True, None, None, True, False, True, (0.0, math.inf)),
           (4, False, "silu", "HP", True, True, True, (1e-3, 0.2))]


def _options(K, conv_bias, activation, D, z, dt_bias, dt_softplus, dt_limit):
    return dict(K=K, conv_bias=conv_bias, activation=activation, D=D, z=z, dt_bias=dt_bias,
                dt_softplus=dt_softplus, dt_limit=dt_limit)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"K{o[0]}-bias{int(o[1])}-{o[2]}-D{o[3]}-z{int(o[4])}")
@pytest.mark.parametrize("pool", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_fused_equals_unfused_pair_bitwise(mode, pool, options):
    _check_fused_equals_pair(mode, pool=pool, **_options(*options))


@pytest.mark.parametrize("pool", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_fused_equals_unfused_pair_bitwise_P128(mode, pool):
    """P = 128: several row passes, all reading the conv rows staged once, before the pools are written."""
    _check_fused_equals_pair(mode, pool=pool, P=128, **_options(*OPTIONS[3]))


@pytest.mark.parametrize("conv_pool", ["bf16", "fp32"])
@pytest.mark.parametrize("pool", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("N", [64, 128, 256])
@pytest.mark.parametrize("P", [64, 128])
def test_every_built_fused_variant_equals_pair(P, N, pool, conv_pool):
    """Snapshot mode (every kind of write) on every built bf16 fused variant; the ci build has few."""
    from mamba2_aot.errors import VariantNotFoundError
    try:
        _check_fused_equals_pair("snapshot", P=P, N=N, pool=pool, conv_pool=conv_pool, **_options(*OPTIONS[0]))
    except VariantNotFoundError as missing:
        pytest.skip(f"not in this build: {missing}")


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_many_heads_and_requests_equal_pair_bitwise(mode):
    """32 heads (CTAs) per request in 4 groups, 16 requests: the request's last CTA writes the shared B and C
    channels (and the conv window count) while up to 31 others of it are still running; three fused runs from the
    same arrays equal each other and the pair, bitwise."""
    batch, T, H, G, capacity = 16, 2, 32, 4, 2
    num_slots = batch + batch * T
    case = FusedCase(batch=batch, T=T, H=H, G=G, K=4, num_slots=num_slots, seed=51)
    idx = _index(list(range(batch)))
    extra, pending = {}, None
    if mode == "snapshot":
        extra["snapshot_indices"] = _index([[batch + b * T + t for t in range(T)] for b in range(batch)])
    if mode == "compact":
        extra["num_accepted"] = _index([b % 3 for b in range(batch)])
        pending = {s: 2 for s in range(batch)}
    start = case.start(mode, capacity=capacity, pending=pending, seed=4)
    pair = _clone(start)
    out_pair, *pair_rejected = launch_pair(mode, case, pair, idx, **extra)
    assert pair_rejected == [0, 0]
    for run in range(3):
        fused = _clone(start)
        out_fused, rejected = launch_fused(mode, case, fused, idx, **extra)
        _assert_same({"out": out_fused, **fused}, {"out": out_pair, **pair}, f"{mode} run {run}: fused vs pair")
        assert rejected == 0


@pytest.mark.parametrize("P", [64, 128])
@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_compact_commit_without_new_rows_equals_pair_bitwise(pool, P):
    """T = 0: fold the accepted pending rows into both pools and empty both windows; no output rows."""
    num_slots = 12
    case = FusedCase(batch=4, T=0, P=P, pool=pool, num_slots=num_slots, seed=5)
    idx = _index([0, -1, 5, 7])
    extra = {"num_accepted": _index([3, 2, 1, 0])}
    start = case.start("compact", capacity=4, pending={0: 3, 5: 2, 7: 1, 9: 4}, seed=8)
    fused, pair = _clone(start), _clone(start)
    out_fused, rejected = launch_fused("compact", case, fused, idx, **extra)
    out_pair, conv_rejected, ssm_rejected = launch_pair("compact", case, pair, idx, **extra)
    _assert_same({"out": out_fused, **fused}, {"out": out_pair, **pair}, "T = 0 fused vs pair")
    assert out_fused.shape[1] == 0 and rejected == conv_rejected == ssm_rejected == 0
    assert fused["conv_window_count"].tolist() == [0] * 9 + [4] + [0] * 2
    assert torch.all(fused["window_count"][[0, 5, 7]] == 0) and torch.all(fused["window_count"][9] == 4)
    for pool_name in ("state", "conv_state"):
        _assert_untouched(start[pool_name], fused[pool_name], [0, 5], what=f"{pool_name} slots")   # slot 7 folds 0
        assert not _same_bits(fused[pool_name][0], start[pool_name][0]), f"{pool_name}: slot 0 folded nothing"
    window = reference.WindowRecord(start["conv_window_count"].cpu().long(),
                                    {"xBC": start["conv_window_xBC"].cpu().double()})
    ref = reference.conv1d_compact(case.conv.pool.cpu(), window, idx.cpu(), num_accepted=extra["num_accepted"].cpu(),
                                   **case.conv.oracle_args())
    assert torch.equal(fused["conv_state"].cpu().double(), ref.pool), "committed conv windows: the oracle's, exactly"


@pytest.mark.parametrize("P,K", [(64, 4), (64, 2), (128, 3)])
@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_scripted_compact_equals_pair_and_snapshot_bitwise(pool, P, K):
    """Scripted speculative decoding with a padding row: per call T draft rows, then the caller accepts some.
    After every call the fused compact replay equals the unfused pair's compact replay (everything, bitwise),
    its outputs equal the fused snapshot mode's, and its committed states (both pools) equal the states snapshot
    mode committed. A last T = 0 call commits the last acceptance."""
    batch, H, N, G, capacity = 3, 4, 128, 2, 4
    script = [(4, 3), (1, 0), (3, 2), (2, 0), (4, 0), (1, 1)]   # (T drafted, how many of them are accepted)
    num_slots = 2 + batch * capacity
    src = _index([0, -1, 1])   # committed states in slots 0, 1; snapshot mode's per-row states in 2..
    layer = dict(H=H, P=P, N=N, G=G, K=K, pool=pool, num_slots=num_slots)
    base = FusedCase(batch=batch, T=1, **layer)
    fused = base.start("compact", capacity=capacity)
    pair = _clone(fused)
    snap = base.start("snapshot")
    accepted_before = 0
    for call, (T, accepted) in enumerate(script + [(0, None)]):
        case = FusedCase(batch=batch, T=T, seed=100 + call, **layer)
        committed = {k: snap[k][:2].clone() for k in ("state", "conv_state")}
        num_accepted = _index([accepted_before] * batch)
        out_compact, rejected = launch_fused("compact", case, fused, src, num_accepted=num_accepted)
        out_pair, *pair_rejected = launch_pair("compact", case, pair, src, num_accepted=num_accepted)
        _assert_same({"out": out_compact, **fused}, {"out": out_pair, **pair}, f"call {call}: fused vs pair")
        assert rejected == 0 and pair_rejected == [0, 0]
        for k, v in committed.items():
            assert _same_bits(fused[k][:2], v), f"call {call}: committed {k} differs from snapshot mode's"
        assert torch.all(fused["window_count"][:2] == T) and torch.all(fused["window_count"][2:] == 0)
        assert fused["conv_window_count"].tolist() == [T, T] + [0] * (num_slots - 2), f"call {call}: counts"
        assert _same_bits(fused["conv_window_xBC"][[0, 1], :T], case.conv.xBC[[0, 2]]), f"call {call}: rows"
        assert torch.all(out_compact[1] == 0), f"call {call}: the padding row outputs zero"
        if accepted is None:
            break
        snaps = _index([[2 + b * capacity + t for t in range(T)] for b in range(batch)])
        out_snap, _ = launch_fused("snapshot", case, snap, src, snapshot_indices=snaps)
        assert _same_bits(out_snap, out_compact), f"call {call}: compact and snapshot outputs differ"
        if accepted > 0:   # commit: the next source is the state after the last accepted row, in both pools
            for k in ("state", "conv_state"):
                snap[k][:2] = snap[k][snaps[[0, 2], accepted - 1].long()]
        accepted_before = accepted
    for k in ("state", "conv_state"):
        assert _same_bits(fused[k][2:], base.start("update")[k][2:]), f"compact mode wrote per-row {k}"


@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_nemotron_h_decode_matches_oracle(pool):
    """The Nemotron-H-like decode shape (H 128, P 64, N 128, G 8: 10240 conv channels, K 4, bias, SiLU), batch 4
    with a padding row and an out-of-range slot, T = 1 update: against the fp64 oracle (conv, its output rounded
    to bf16 as conv1d_verify hands it on, then the SSM) within the verify tolerances; the conv pool exactly (raw
    inputs); and bitwise the unfused pair."""
    H, P, N, G, num_slots = 128, 64, 128, 8, 12
    assert H * P + 2 * G * N == NEMOTRON_H_CHANNELS
    case = FusedCase(batch=4, T=1, H=H, P=P, N=N, G=G, K=4, pool=pool, num_slots=num_slots, D="HP",
                     dt_limit=(1e-3, 0.2))
    idx = _index([3, -1, 11, 12])   # valid, padding, the last slot, out of range
    start = case.start("update")
    fused, pair = _clone(start), _clone(start)
    out, rejected = launch_fused("update", case, fused, idx)

    conv_ref = reference.conv1d_update(case.conv.pool.cpu(), idx.cpu(), **case.conv.oracle_args())
    x, B, C = case.split(conv_ref.out.to(torch.bfloat16))
    ssm_args = {**case.ssm.oracle_args(), "x": x, "B": B, "C": C}
    ref = reference.verify_update(case.ssm.pool.cpu(), idx.cpu(), pool_dtype=TORCH_DTYPES[pool], **ssm_args)
    tol_out, tol_states = _tolerances("bf16", pool)
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0), "padding and out-of-range rows output zero"
    reference.assert_close_scaled(fused["state"][[3, 11]].cpu(), ref.pool[[3, 11]], tol_states, "written states")
    assert torch.equal(fused["conv_state"].cpu().double(), conv_ref.pool), "the conv pool: the oracle's, exactly"
    for name in ("state", "conv_state"):
        _assert_untouched(start[name], fused[name], [3, 11], what=f"{name} slots")
    assert rejected == 1 == int(ref.out_of_range.sum())

    out_pair, *pair_rejected = launch_pair("update", case, pair, idx)
    _assert_same({"out": out, **fused}, {"out": out_pair, **pair}, "Nemotron-H fused vs pair")
    assert pair_rejected == [1, 1]


@pytest.mark.parametrize("K,conv_bias,activation", [(4, True, "silu"), (2, False, None)])
def test_compact_window_holds_the_conv_outputs(K, conv_bias, activation):
    """In compact mode the SSM window record keeps the x and B the SSM consumed: the fused conv's outputs,
    observable. They are the oracle's conv outputs within half a bf16 ulp (one fp32 sum rounded to bf16);
    window_dt keeps the raw dt."""
    T, num_slots = 3, 12
    case = FusedCase(batch=4, T=T, K=K, conv_bias=conv_bias, activation=activation, num_slots=num_slots, seed=21)
    idx = _index([0, -1, 5, 9])
    state = case.start("compact")
    launch_fused("compact", case, state, idx, num_accepted=_index([0, 0, 0, 0]))
    conv_ref = reference.conv1d_update(case.conv.pool.cpu(), idx.cpu(), **case.conv.oracle_args())
    x_ref, B_ref, _ = case.split(conv_ref.out)
    heads_per_group = case.H // case.G
    for b, slot in ((0, 0), (2, 5), (3, 9)):
        _assert_out(state["window_x"][slot, :T], x_ref[b], f"slot {slot}: window_x")
        _assert_out(state["window_B"][slot, :T], B_ref[b].repeat_interleave(heads_per_group, dim=1),
                    f"slot {slot}: window_B")
        assert _same_bits(state["window_dt"][slot, :T], case.ssm.kwargs["dt"][b]), f"slot {slot}: window_dt"


@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_single_token_fused_updates_equal_one_multi_token_update_bitwise(pool):
    T = 4
    case = FusedCase(batch=4, T=T, pool=pool, seed=31)
    idx = _index([0, 5, 2, 9])
    multi = case.start("update")
    out_multi, _ = launch_fused("update", case, multi, idx)
    single = case.start("update")
    outs = [launch_fused("update", case.rows(t, t + 1), single, idx)[0] for t in range(T)]
    _assert_same({"out": out_multi, **multi}, {"out": torch.cat(outs, dim=1), **single}, "T single-token updates")


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_repeated_launches_are_bitwise_equal(mode):
    """The same fused call twice from the same starting arrays (the second takes the runtime's memoised path);
    launch_fused checks the inputs unchanged and the tickets zero after each."""
    num_slots = 12
    case = FusedCase(batch=4, T=3, num_slots=num_slots, seed=41)
    idx, extra, pending, _, _ = _requests(mode, num_slots)
    start = case.start(mode, capacity=4, pending=pending, seed=6)
    state = _clone(start)
    results = []
    for _ in range(2):
        for k, v in state.items():
            v.copy_(start[k])
        out, rejected = launch_fused(mode, case, state, idx, **extra)
        results.append(({"out": out, **_clone(state)}, rejected))
    _assert_same(results[0][0], results[1][0], f"{mode}: repeated launch")
    assert results[0][1] == results[1][1]
