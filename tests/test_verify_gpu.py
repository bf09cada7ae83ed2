"""verify on the GPU: update / snapshot / compact replay against the fp64 oracle and against each other.

Needs a CUDA device and the verify cubins (``scons`` output or installed wheels); see tests/conftest.py.
"""
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from reference import generators  # noqa: E402

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _runtime():
    from mamba2_aot import runtime
    return runtime


def _tolerances(io_dtype, pool_dtype):
    """(out, states) tolerances from docs/TOLERANCES.md. The state math is fp32: an fp32 pool's states are
    held to the fp32 bound; a bf16 / fp16 pool has its own row; outputs to the looser of the I/O dtype's
    row and the pool's (the output rounding and the state rounding both show in them)."""
    out = reference.TOLERANCES[io_dtype]["out"]
    if pool_dtype == "fp32":
        return out, reference.TOLERANCES["fp32"]["states"]
    row = reference.TOLERANCES[f"pool_{pool_dtype}"]
    return max(out, row["out"]), row["states"]


class Case:
    """One verify problem: inputs on the GPU, a pool with random states, and the oracle's view of them."""

    def __init__(self, *, batch=4, T=1, H=16, P=64, N=128, G=4, io="bf16", pool="fp32", num_slots=12, seed=0,
                 D="H", z=True, dt_bias=True, dt_limit=(0.0, math.inf)):
        dtype = TORCH_DTYPES[io]
        inputs = generators.standard_inputs(batch, T, H, P, N, G, dtype, seed, D=D, z=z)
        # a layer's parameters stay fixed from call to call; only the activations change with the seed
        params = generators.standard_inputs(1, 1, H, P, N, G, dtype, 0, D=D)
        inputs.update({k: params[k] for k in ("A", "D", "dt_bias") if k in params})
        if not dt_bias:
            del inputs["dt_bias"]
        self.kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        self.kwargs["dt_limit"] = dt_limit
        gen = torch.Generator().manual_seed(seed + 7)
        self.pool = torch.randn(num_slots, H, P, N, generator=gen).to(TORCH_DTYPES[pool]).cuda()
        self.io, self.pool_dtype = io, pool
        self.shape = (batch, T, H, P)

    def out(self):
        return torch.full(self.shape, float("nan"), dtype=TORCH_DTYPES[self.io], device="cuda")

    def oracle_args(self):
        return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in self.kwargs.items()}


def _tokens(kwargs, first, stop):
    """A call's inputs with its per-token arrays (x, dt, B, C, z: rank 3 and up) cut to tokens first .. stop - 1."""
    return {k: (v[:, first:stop] if isinstance(v, torch.Tensor) and v.dim() >= 3 else v) for k, v in kwargs.items()}


def _launch(mode, case, pool, out, state_indices, **extra):
    _runtime().launch("verify", mode=mode, state=pool, out=out, state_indices=state_indices,
                      **case.kwargs, **extra)


@pytest.mark.parametrize("io,pool", [("bf16", "fp32"), ("bf16", "bf16")])
@pytest.mark.parametrize("T", [1, 4])
def test_update_matches_oracle(io, pool, T):
    case = Case(T=T, io=io, pool=pool, D="HP", dt_limit=(1e-3, 0.2))
    idx = torch.tensor([3, -1, 11, 12], dtype=torch.int32, device="cuda")  # valid, padding, last, out of range
    rejected = torch.zeros(1, dtype=torch.int32, device="cuda")
    before = {k: v.clone() for k, v in case.kwargs.items() if isinstance(v, torch.Tensor)}
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("update", case, pool_gpu, out, idx, rejected=rejected)
    torch.cuda.synchronize()

    ref = reference.verify_update(case.pool.cpu(), idx.cpu(), pool_dtype=TORCH_DTYPES[pool], **case.oracle_args())
    tol_out, tol_states = _tolerances(io, pool)
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0), "padding and out-of-range rows output zero"
    touched = [3, 11]
    reference.assert_close_scaled(pool_gpu[touched].cpu(), ref.pool[touched], tol_states, "written states")
    untouched = [s for s in range(case.pool.shape[0]) if s not in touched]
    assert torch.equal(pool_gpu[untouched], case.pool[untouched]), "slots not named must keep their bytes"
    assert rejected.item() == 1, "one out-of-range slot"
    for k, v in before.items():
        assert torch.equal(case.kwargs[k], v), f"input {k} was written"


def test_snapshot_matches_oracle():
    case = Case(T=4, pool="fp32", num_slots=24, D=None)
    idx = torch.tensor([0, 1, -1, 2], dtype=torch.int32, device="cuda")
    snaps = torch.tensor([[4, 5, -1, 6], [7, 8, 9, 24], [10, 11, 12, 13], [14, -1, 15, 16]],
                         dtype=torch.int32, device="cuda")
    rejected = torch.zeros(1, dtype=torch.int32, device="cuda")
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("snapshot", case, pool_gpu, out, idx, snapshot_indices=snaps, rejected=rejected)
    ref = reference.verify_snapshot(case.pool.cpu(), idx.cpu(), snapshot_indices=snaps.cpu(),
                                    pool_dtype=torch.float32, **case.oracle_args())
    tol_out, tol_states = _tolerances("bf16", "fp32")
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    written = [4, 5, 6, 7, 8, 9, 14, 15, 16]
    reference.assert_close_scaled(pool_gpu[written].cpu(), ref.pool[written], tol_states, "snapshots")
    unwritten = [s for s in range(24) if s not in written]
    assert torch.equal(pool_gpu[unwritten], case.pool[unwritten]), "source and padding rows' slots untouched"
    assert rejected.item() == 1


@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_single_token_updates_equal_one_multi_token_update_bitwise(pool):
    T = 6
    case = Case(T=T, pool=pool)
    idx = torch.tensor([0, 5, 2, 9], dtype=torch.int32, device="cuda")
    pool_multi, out_multi = case.pool.clone(), case.out()
    _launch("update", case, pool_multi, out_multi, idx)
    pool_single, out_single = case.pool.clone(), case.out()
    for t in range(T):
        step = _tokens(case.kwargs, t, t + 1)
        _runtime().launch("verify", mode="update", state=pool_single, out=out_single[:, t:t + 1],
                          state_indices=idx, **step)
    torch.cuda.synchronize()
    assert torch.equal(out_multi, out_single)
    assert torch.equal(pool_multi, pool_single)


def _copy_at(v, offset):
    """A contiguous copy of ``v`` starting ``offset`` elements into a larger buffer (1: off 16-byte alignment)."""
    buffer = torch.empty(v.numel() + offset, dtype=v.dtype, device="cuda")
    return buffer[offset:].view(v.shape).copy_(v)


def _window(num_slots, capacity, H, P, N, io):
    dtype = TORCH_DTYPES[io]
    return {"window_count": torch.zeros(num_slots, H, dtype=torch.int32, device="cuda"),
            "window_x": torch.zeros(num_slots, capacity, H, P, dtype=dtype, device="cuda"),
            "window_B": torch.zeros(num_slots, capacity, H, N, dtype=dtype, device="cuda"),
            "window_dt": torch.zeros(num_slots, capacity, H, dtype=dtype, device="cuda")}


@pytest.mark.parametrize("P,N", [(64, 128), (128, 128)])   # split CTAs run one pass each / two passes each
@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_single_token_snapshots_equal_one_multi_token_snapshot_bitwise(pool, P, N):
    """A decode (T = 1: inputs read into registers, Δ per lane) against the staged path of a T-token call, in
    snapshot mode: the same outputs and snapshot slots bitwise, with a padding row, an out-of-range slot and a
    skipped snapshot; untouched slots keep their bytes."""
    T = 3
    case = Case(T=T, P=P, N=N, pool=pool, num_slots=16)
    idx = torch.tensor([0, -1, 1, 40], dtype=torch.int32, device="cuda")
    snaps = torch.tensor([[2, 3, 4], [5, 6, 7], [8, -1, 9], [10, 11, 12]], dtype=torch.int32, device="cuda")
    pool_multi, out_multi = case.pool.clone(), case.out()
    _launch("snapshot", case, pool_multi, out_multi, idx, snapshot_indices=snaps)
    pool_single, out_single = case.pool.clone(), case.out()
    src = idx.clone()
    for t in range(T):
        step = _tokens(case.kwargs, t, t + 1)
        _runtime().launch("verify", mode="snapshot", state=pool_single, out=out_single[:, t:t + 1],
                          state_indices=src, snapshot_indices=snaps[:, t:t + 1].contiguous(), **step)
        # the next token starts from this one's snapshot (where there is one to start from)
        src = torch.where((idx >= 0) & (idx < 16) & (snaps[:, t] >= 0), snaps[:, t], -1).to(torch.int32)
    torch.cuda.synchronize()
    valid = (idx >= 0) & (idx < 16)
    for b in range(4):
        for t in range(T):
            chained = bool(valid[b]) and bool(snaps[b, :t].ge(0).all())   # token t's single call had its source
            if chained or not valid[b]:
                assert torch.equal(out_multi[b, t], out_single[b, t]), (b, t)
            if chained and snaps[b, t] >= 0:
                assert torch.equal(pool_multi[snaps[b, t]], pool_single[snaps[b, t]]), (b, t)
    for slot in (0, 1, 5, 6, 7, 10, 11, 12, 13, 14, 15):   # sources, padding rows' snapshots, unnamed slots
        assert torch.equal(pool_multi[slot], case.pool[slot]) and torch.equal(pool_single[slot], case.pool[slot])


@pytest.mark.parametrize("P", [64, 128])
@pytest.mark.parametrize("pool", ["fp32", "bf16"])
def test_compact_replay_equals_snapshot_bitwise(pool, P):
    """Scripted speculative decoding: per call T draft rows, then the caller accepts some of them.
    (P = 128 takes several row passes in both modes, P = 64 one pass in compact mode and two in snapshot.)"""
    _compact_replay_against_snapshot(pool, P, T=5, capacity=8, accepted_script=[3, 0, 2, 0, 0, 1, 5])


@pytest.mark.parametrize("P", [64, 128])
def test_long_compact_replay_equals_snapshot_bitwise(P):
    """Windows longer than one staged tile (16 rows): the fold and the new rows each take two tiles (P = 128:
    in each of two row passes, restaged)."""
    _compact_replay_against_snapshot("fp32", P, T=18, capacity=24, accepted_script=[17, 0, 18, 3])


def test_unaligned_window_is_read_and_written_element_by_element():
    """A window record one element off 16 bytes (element copies for the fold's reads and the new window's
    writes) gives the aligned record's results bitwise: outputs, the folded state, the new window."""
    batch, T, H, P, N, G, capacity = 2, 5, 16, 64, 128, 4, 8
    results = []
    for offset in (0, 1):
        case = Case(batch=batch, T=T, H=H, P=P, N=N, G=G, num_slots=4, seed=5)
        window = _window(4, capacity, H, P, N, "bf16")
        gen = torch.Generator(device="cuda").manual_seed(9)
        for name in ("window_x", "window_B", "window_dt"):
            window[name].copy_(torch.randn(window[name].shape, generator=gen, device="cuda") * 0.5)
        window["window_count"].fill_(capacity)
        for name in ("window_x", "window_B"):
            window[name] = _copy_at(window[name], offset)
        pool, out = case.pool.clone(), case.out()
        accepted = torch.tensor([6, 3], dtype=torch.int32, device="cuda")
        _launch("compact", case, pool, out, torch.tensor([1, 2], dtype=torch.int32, device="cuda"),
                num_accepted=accepted, **window)
        torch.cuda.synchronize()
        results.append((out, pool, window))
    (out_a, pool_a, win_a), (out_u, pool_u, win_u) = results
    assert torch.equal(out_a, out_u) and torch.equal(pool_a, pool_u)
    for name in win_a:
        assert torch.equal(win_a[name], win_u[name]), name


def _compact_replay_against_snapshot(pool, P, *, T, capacity, accepted_script):
    batch, H, N, G = 2, 16, 128, 4
    num_slots = 2 + batch * T
    base = Case(batch=batch, T=T, H=H, P=P, N=N, G=G, pool=pool, num_slots=num_slots)
    src = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    # snapshot mode: the committed state lives in slots 0, 1; token snapshots go to slots 2..
    snap_pool = base.pool.clone()
    # compact mode: the state stays in slots 0, 1; pending rows live in the window record
    compact_pool = base.pool.clone()
    window = _window(num_slots, capacity, H, P, N, "bf16")
    for call, accepted in enumerate(accepted_script + [None]):
        case = Case(batch=batch, T=T, H=H, P=P, N=N, G=G, pool=pool, num_slots=num_slots, seed=100 + call)
        final = accepted is None
        if not final:
            snaps = torch.tensor([[2 + b * T + t for t in range(T)] for b in range(batch)], dtype=torch.int32,
                                 device="cuda")
            out_snap = case.out()
            _launch("snapshot", case, snap_pool, out_snap, src, snapshot_indices=snaps)
        num_accepted = torch.full((batch,), 0 if call == 0 else accepted_script[call - 1], dtype=torch.int32,
                                  device="cuda")
        if final:  # a T = 0 call only folds: the committed state becomes visible in the pool
            empty = _tokens(case.kwargs, 0, 0)
            _runtime().launch("verify", mode="compact", state=compact_pool, out=case.out()[:, :0],
                              state_indices=src, num_accepted=num_accepted, **window, **empty)
            break
        out_compact = case.out()
        _launch("compact", case, compact_pool, out_compact, src, num_accepted=num_accepted, **window)
        torch.cuda.synchronize()
        assert torch.equal(out_snap, out_compact), f"call {call}: outputs differ"
        # commit in snapshot mode: the next source is the snapshot of the last accepted token
        if accepted > 0:  # copied into the source slots, so the next call's snapshots cannot clobber it
            snap_pool[src.long()] = snap_pool[snaps[:, accepted - 1].long()]
    torch.cuda.synchronize()
    assert torch.equal(compact_pool[:2], snap_pool[:2]), "committed states differ"


def test_long_update_stages_rows_in_tiles():
    """T = 37: three staged tiles, against the oracle and bitwise against snapshot mode's last state."""
    case = Case(T=37, pool="fp32", num_slots=8, D="HP")
    idx = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device="cuda")
    pool_gpu, out = case.pool.clone(), case.out()
    _launch("update", case, pool_gpu, out, idx)
    ref = reference.verify_update(case.pool.cpu(), idx.cpu(), pool_dtype=torch.float32, **case.oracle_args())
    tol_out, tol_states = _tolerances("bf16", "fp32")
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    reference.assert_close_scaled(pool_gpu[:4].cpu(), ref.pool[:4], tol_states, "states")
    snaps = torch.full((4, 37), -1, dtype=torch.int32, device="cuda")
    snaps[:, -1] = torch.arange(4, 8, dtype=torch.int32, device="cuda")
    snap_pool, snap_out = case.pool.clone(), case.out()
    _launch("snapshot", case, snap_pool, snap_out, idx, snapshot_indices=snaps)
    assert torch.equal(snap_out, out) and torch.equal(snap_pool[4:8], pool_gpu[:4])


@pytest.mark.parametrize("mode", ["update", "snapshot"])
def test_split_unsplit_and_unaligned_calls_agree_bitwise(mode):
    """The same requests three ways: a small call (its row passes in two CTAs each), inside a batch large enough
    for one CTA per (head, request), and with x, B, C, z unaligned for 16-byte copies (element-wise staging)."""
    H, T, small, large = 16, 3, 4, 12   # 16 x 4 CTAs split; 16 x 12 = 192 > 132 do not
    case = Case(batch=large, T=T, H=H, num_slots=2 * large * (T + 1))
    idx = torch.arange(large, dtype=torch.int32, device="cuda")

    def extra(rows):   # snapshots of request b's token t go to slot large + b * T + t
        if mode == "update":
            return {}
        return {"snapshot_indices": (large + torch.arange(rows * T, dtype=torch.int32, device="cuda")).view(rows, T)}

    pool_large, out_large = case.pool.clone(), case.out()
    _launch(mode, case, pool_large, out_large, idx, **extra(large))

    head = {k: (v[:small] if isinstance(v, torch.Tensor) and v.dim() >= 3 else v) for k, v in case.kwargs.items()}
    pool_small, out_small = case.pool.clone(), case.out()[:small]
    _runtime().launch("verify", mode=mode, state=pool_small, out=out_small, state_indices=idx[:small],
                      **head, **extra(small))

    unaligned = dict(head)
    for name in ("x", "B", "C", "z"):
        unaligned[name] = _copy_at(head[name], 1)
    pool_unaligned, out_unaligned = case.pool.clone(), case.out()[:small]
    _runtime().launch("verify", mode=mode, state=pool_unaligned, out=out_unaligned, state_indices=idx[:small],
                      **unaligned, **extra(small))
    torch.cuda.synchronize()

    assert torch.equal(out_small, out_large[:small]) and torch.equal(out_unaligned, out_small)
    written = list(range(small)) if mode == "update" else list(range(large, large + small * T))
    assert torch.equal(pool_small[written], pool_large[written])
    assert torch.equal(pool_unaligned, pool_small)


VARIANT_SWEEP = [(P, N, io, pool) for P in (64, 128) for N in (64, 128, 256) for io in ("bf16", "fp16", "fp32")
                 for pool in ("fp32", "bf16", "fp16")]


@pytest.mark.parametrize("P,N,io,pool", VARIANT_SWEEP)
def test_every_built_variant_matches_oracle(P, N, io, pool):
    """update (T = 3) and snapshot on every built (headdim, d_state, dtype) variant; the ci build has few."""
    from mamba2_aot.errors import VariantNotFoundError
    case = Case(batch=2, T=3, H=4, P=P, N=N, G=2, io=io, pool=pool, num_slots=6, seed=P + N)
    idx = torch.tensor([4, 1], dtype=torch.int32, device="cuda")
    pool_gpu, out = case.pool.clone(), case.out()
    try:
        _launch("update", case, pool_gpu, out, idx)
    except VariantNotFoundError:
        pytest.skip(f"verify P{P} N{N} {io}/{pool} is not in this build")
    ref = reference.verify_update(case.pool.cpu(), idx.cpu(), pool_dtype=TORCH_DTYPES[pool], **case.oracle_args())
    tol_out, tol_states = _tolerances(io, pool)
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    reference.assert_close_scaled(pool_gpu[[4, 1]].cpu(), ref.pool[[4, 1]], tol_states, "states")
    snaps = torch.tensor([[0, 2, 3], [-1, -1, 5]], dtype=torch.int32, device="cuda")
    snap_pool, snap_out = case.pool.clone(), case.out()
    _launch("snapshot", case, snap_pool, snap_out, idx, snapshot_indices=snaps)
    assert torch.equal(snap_out, out), "snapshot and update emit the same outputs"
    assert torch.equal(snap_pool[3], pool_gpu[4]) and torch.equal(snap_pool[5], pool_gpu[1]), \
        "the last snapshot equals the updated state, bitwise"
    # a decode (T = 1: no staging) of the first token equals the staged call's first token, bitwise
    first = _tokens(case.kwargs, 0, 1)
    decode_pool, decode_out = case.pool.clone(), case.out()[:, :1].contiguous()
    _runtime().launch("verify", mode="snapshot", state=decode_pool, out=decode_out, state_indices=idx,
                      snapshot_indices=snaps[:, :1].contiguous(), **first)
    assert torch.equal(decode_out, out[:, :1]) and torch.equal(decode_pool[0], snap_pool[0]), "decode vs staged"
