"""Self-tests of the verify-family references (state pools; SSM and causal conv1d): CPU only.

The update / snapshot / compact-replay properties are checked *bitwise* (BRIEF §2 requires it of the
kernels; the oracle must satisfy it too), for the SSM and the conv through one family table.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import (assert_close_scaled, conv1d_compact, conv1d_prefill, conv1d_snapshot, conv1d_update,
                       conv_window, ssd_chunked_reference, ssd_reference, ssm_window, verify_compact,
                       verify_snapshot, verify_update)
from reference.generators import packed_inputs, standard_inputs

H, P, N, G, CHANNELS, K = 4, 3, 2, 2, 5, 4
NUM_SLOTS = 24


def ssm_rows(seed, Bt, T):
    inp = standard_inputs(Bt, T, H, P, N, G, torch.bfloat16, seed, D="HP", z=True)
    params = standard_inputs(1, 1, H, P, N, G, torch.bfloat16, seed=0, D="HP")       # fixed across calls
    return {**{k: inp[k] for k in ("x", "dt", "B", "C", "z")},
            **{k: params[k] for k in ("A", "D", "dt_bias", "dt_softplus")}}


def conv_rows(seed, Bt, T):
    gen = torch.Generator().manual_seed(0)
    return {"xBC": torch.randn(Bt, T, CHANNELS, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16),
            "weight": torch.randn(CHANNELS, K, generator=gen), "bias": torch.randn(CHANNELS, generator=gen)}


FAMILIES = {
    "ssm": dict(rows=ssm_rows, update=verify_update, snapshot=verify_snapshot, compact=verify_compact,
                state_shape=(H, P, N), window=lambda cap: ssm_window(NUM_SLOTS, cap, H, P, G, N)),
    "conv": dict(rows=conv_rows, update=conv1d_update, snapshot=conv1d_snapshot, compact=conv1d_compact,
                 state_shape=(CHANNELS, K - 1), window=lambda cap: conv_window(NUM_SLOTS, cap, CHANNELS)),
}
POOL_DTYPES = [None, torch.float32, torch.bfloat16, torch.float16]


def make_pool(family, pool_dtype, seed=0):
    pool = torch.randn(NUM_SLOTS, *FAMILIES[family]["state_shape"], generator=torch.Generator().manual_seed(seed))
    return pool.to(pool_dtype or torch.float64)


def take(rows, t0, t1):
    """Rows t0:t1 of every per-token input (the others are parameters)."""
    return {k: (v[:, t0:t1] if k in ("x", "dt", "B", "C", "z", "xBC") else v) for k, v in rows.items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pool_dtype", POOL_DTYPES)
def test_T_single_token_updates_equal_one_T_token_update(family, pool_dtype):
    fam, T = FAMILIES[family], 5
    pool, slots = make_pool(family, pool_dtype), torch.tensor([3, 7, 0], dtype=torch.int32)
    rows = fam["rows"](1, 3, T)
    once = fam["update"](pool, slots, **rows, pool_dtype=pool_dtype)
    outs, stepwise = [], pool
    for t in range(T):
        res = fam["update"](stepwise, slots, **take(rows, t, t + 1), pool_dtype=pool_dtype)
        outs.append(res.out)
        stepwise = res.pool
    assert torch.equal(torch.cat(outs, 1), once.out)
    assert torch.equal(stepwise, once.pool)
    if pool_dtype is not None:
        assert torch.equal(once.pool.to(pool_dtype).double(), once.pool)      # stored states are representable


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pool_dtype", [None, torch.bfloat16])
def test_snapshot_slots_hold_the_states_update_would_store(family, pool_dtype):
    fam, T = FAMILIES[family], 4
    pool, slots = make_pool(family, pool_dtype), torch.tensor([1, 2], dtype=torch.int32)
    snaps = torch.tensor([[4, 5, -1, 6], [8, 9, 10, 99]], dtype=torch.int32)       # -1, 99: not written
    rows = fam["rows"](2, 2, T)
    res = fam["snapshot"](pool, slots, **rows, snapshot_indices=snaps, pool_dtype=pool_dtype)
    assert torch.equal(res.pool[[1, 2]], pool[[1, 2]].double())                    # sources not written
    for slot in (0, 3, 7, 11):
        assert torch.equal(res.pool[slot], pool[slot].double())
    for t in range(T):
        upd = fam["update"](pool, slots, **take(rows, 0, t + 1), pool_dtype=pool_dtype)
        assert torch.equal(res.out[:, :t + 1], upd.out)
        for b in range(2):
            if 0 <= snaps[b, t] < NUM_SLOTS:
                assert torch.equal(res.pool[snaps[b, t]], upd.pool[slots[b]])
            elif snaps[b, t] >= 0:
                assert not res.out_of_range[b]                                   # only state_indices count


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_padding_and_out_of_range_rows_read_and_write_nothing(family, mode):
    fam, T = FAMILIES[family], 3
    pool = make_pool(family, torch.float32)
    pool_before = pool.clone()
    slots = torch.tensor([-1, 5, NUM_SLOTS + 2, -7], dtype=torch.int32)    # only row 1 runs
    rows = fam["rows"](3, 4, T)
    snaps = torch.arange(4 * T, dtype=torch.int32).reshape(4, T) % NUM_SLOTS
    if mode == "update":
        res, written = fam["update"](pool, slots, **rows), {5}
    elif mode == "snapshot":
        res, written = fam["snapshot"](pool, slots, **rows, snapshot_indices=snaps), set(snaps[1].tolist())
    else:
        res = fam["compact"](pool, fam["window"](4), slots, **rows, num_accepted=torch.zeros(4, dtype=torch.int32))
        written = set()
        assert res.window.count.tolist() == [T if s == 5 else 0 for s in range(NUM_SLOTS)]
    assert torch.equal(pool, pool_before)                                        # input untouched
    assert res.out_of_range.tolist() == [False, False, True, False]
    for b in (0, 2, 3):
        assert torch.equal(res.out[b], torch.zeros_like(res.out[b]))
    assert res.out[1].abs().sum() > 0
    for slot in set(range(NUM_SLOTS)) - written:
        assert torch.equal(res.pool[slot], pool[slot].double()), slot


def snapshot_vs_compact(family, T_list, accepted, pool_dtype, capacity):
    """Drive snapshot mode and compact mode through the same calls and acceptances; compare bitwise.

    accepted[n][b]: how many of call n's T_list[n] rows request b accepts (folded by call n+1).
    Snapshot mode: request b starts in home slot homes[b]; each call writes its per-row snapshots to
    whichever of b's two banks does not hold its current source, and the next call starts from the
    snapshot of the last accepted row (or from the same source when none was accepted). Compact mode
    keeps everything in the home slot.
    """
    fam = FAMILIES[family]
    Bt = len(accepted[0])
    homes = torch.arange(Bt, dtype=torch.int32)
    banks = [[Bt + (2 * b + k) * capacity for k in range(2)] for b in range(Bt)]       # first slot of each bank
    assert Bt + 2 * Bt * capacity <= NUM_SLOTS
    snap_pool = compact_pool = make_pool(family, pool_dtype, seed=7)
    window = fam["window"](capacity)
    sources = homes.clone()
    previous = [0] * Bt
    for n, T in enumerate(T_list):
        rows = fam["rows"](100 + n, Bt, T)
        bank = [banks[b][int(banks[b][0] <= sources[b] < banks[b][0] + capacity)] for b in range(Bt)]
        snaps = torch.tensor([[bank[b] + t for t in range(T)] for b in range(Bt)], dtype=torch.int32)
        snap = fam["snapshot"](snap_pool, sources, **rows, snapshot_indices=snaps, pool_dtype=pool_dtype)
        comp = fam["compact"](compact_pool, window, homes, **rows, num_accepted=torch.tensor(previous),
                              pool_dtype=pool_dtype)
        for b in range(Bt):
            assert torch.equal(comp.pool[homes[b]], snap_pool[sources[b]].double()), f"call {n} row {b} state"
        assert torch.equal(comp.out, snap.out), f"call {n} outputs"
        assert not comp.accepted_clamped.any()
        snap_pool, compact_pool, window = snap.pool, comp.pool, comp.window
        for b in range(Bt):
            if accepted[n][b]:
                sources[b] = snaps[b, accepted[n][b] - 1]
        previous = list(accepted[n])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pool_dtype", [None, torch.bfloat16, torch.float16])
def test_compact_replay_equals_snapshot_mode_scripted(family, pool_dtype):
    capacity = 4
    T_list = [4, 1, 3, 4, 2, 4, 1, 3, 4]
    accepted = [[3, 4], [0, 1], [2, 3], [0, 4], [0, 0], [1, 4], [1, 0], [3, 2], [4, 1]]
    snapshot_vs_compact(family, T_list, accepted, pool_dtype, capacity)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), family=st.sampled_from(list(FAMILIES)), pool_dtype=st.sampled_from(POOL_DTYPES))
def test_compact_replay_equals_snapshot_mode_property(data, family, pool_dtype):
    capacity = data.draw(st.integers(1, 5), "capacity")
    T_list = data.draw(st.lists(st.integers(1, capacity), min_size=1, max_size=6), "T_list")
    accepted = [[data.draw(st.integers(0, T)) for _ in range(2)] for T in T_list]
    snapshot_vs_compact(family, T_list, accepted, pool_dtype, capacity)


@pytest.mark.parametrize("family", FAMILIES)
def test_compact_clamps_num_accepted_and_refuses_oversized_windows(family):
    fam = FAMILIES[family]
    pool, window, slots = make_pool(family, None), fam["window"](3), torch.tensor([0, 1, 2], dtype=torch.int32)
    first = fam["compact"](pool, window, slots, **fam["rows"](1, 3, 2), num_accepted=torch.zeros(3, dtype=torch.int32))
    second = fam["compact"](first.pool, first.window, slots, **fam["rows"](2, 3, 1),
                            num_accepted=torch.tensor([5, -1, 2], dtype=torch.int32))
    assert second.accepted_clamped.tolist() == [True, True, False]
    ref = fam["compact"](first.pool, first.window, slots, **fam["rows"](2, 3, 1),
                         num_accepted=torch.tensor([2, 0, 2], dtype=torch.int32))
    assert torch.equal(second.pool, ref.pool) and torch.equal(second.out, ref.out)
    with pytest.raises(ValueError, match="capacity"):
        fam["compact"](pool, window, slots, **fam["rows"](3, 3, 4), num_accepted=torch.zeros(3, dtype=torch.int32))


def test_verify_update_matches_both_ssd_references():
    T = 6
    pool = make_pool("ssm", None)
    slots = torch.tensor([4, 9], dtype=torch.int32)
    rows = ssm_rows(5, 2, T)
    res = verify_update(pool, slots, **rows)
    seq = ssd_reference(**rows, initial_states=pool[slots], return_final_states=True)
    chk = ssd_chunked_reference(**rows, initial_states=pool[slots], chunk_size=4, return_final_states=True)
    assert torch.equal(res.out, seq["out"]) and torch.equal(res.pool[slots], seq["final_states"])
    assert_close_scaled(res.out, chk["out"], 1e-12, "out")
    assert_close_scaled(res.pool[slots], chk["final_states"], 1e-12, "states")


# ---- conv1d -------------------------------------------------------------------------------------

def torch_conv(xBC, weight, bias, initial):
    """Independent check: F.conv1d (depthwise) on [initial window | tokens], then SiLU."""
    u = torch.cat([initial.double(), xBC.double().transpose(1, 2)], dim=2)           # (B, channels, K-1+L)
    y = F.conv1d(u, weight.double()[:, None, :], bias.double(), groups=weight.shape[0])
    return F.silu(y).transpose(1, 2)


@pytest.mark.parametrize("with_initial", [False, True])
def test_conv_prefill_matches_torch_conv1d(with_initial):
    rows = conv_rows(3, 2, 9)
    initial = torch.randn(2, CHANNELS, K - 1, generator=torch.Generator().manual_seed(4)) if with_initial else None
    got = conv1d_prefill(rows["xBC"], rows["weight"], rows["bias"], initial_conv_states=initial)
    base = initial if with_initial else torch.zeros(2, CHANNELS, K - 1)
    assert_close_scaled(got["out"], torch_conv(rows["xBC"], rows["weight"], rows["bias"], base), 1e-14, "out")
    window = torch.cat([base.double(), rows["xBC"].double().transpose(1, 2)], 2)[:, :, -(K - 1):]
    assert torch.equal(got["final_conv_states"], window)


@pytest.mark.parametrize("form", ["cu_seqlens", "seq_idx"])
def test_conv_prefill_packed_equals_separate(form):
    lengths = [1, 2, 7, 3]                           # 1 and 2 are shorter than the K-1 = 3 window
    packed = packed_inputs(1, 1, 1, 1, torch.float32, seed=0, chunk_size=4, lengths=lengths)
    cu = packed["cu_seqlens"]
    gen = torch.Generator().manual_seed(8)
    xBC = torch.randn(1, sum(lengths), CHANNELS, generator=gen)
    initial = torch.randn(len(lengths), CHANNELS, K - 1, generator=gen)
    weight, bias = torch.randn(CHANNELS, K, generator=gen), torch.randn(CHANNELS, generator=gen)
    got = conv1d_prefill(xBC, weight, bias, initial_conv_states=initial, **{form: packed[form]})
    for i in range(len(lengths)):
        alone = conv1d_prefill(xBC[:, cu[i]:cu[i + 1]], weight, bias, initial_conv_states=initial[i:i + 1])
        assert torch.equal(got["out"][:, cu[i]:cu[i + 1]], alone["out"])
        assert torch.equal(got["final_conv_states"][i], alone["final_conv_states"][0])


def test_conv_prefill_hands_off_to_update():
    rows = conv_rows(6, 2, 10)
    whole = conv1d_prefill(rows["xBC"], rows["weight"], rows["bias"])
    head = conv1d_prefill(rows["xBC"][:, :7], rows["weight"], rows["bias"])
    tail = conv1d_update(head["final_conv_states"], torch.tensor([0, 1]), rows["xBC"][:, 7:], rows["weight"], rows["bias"])
    assert torch.equal(torch.cat([head["out"], tail.out], 1), whole["out"])
    assert torch.equal(tail.pool, whole["final_conv_states"])
