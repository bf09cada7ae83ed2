"""Self-tests of the fp64 SSD oracle (tests/reference): CPU only, each one able to fail.

The two formulations (token-by-token ``ssd_reference`` and chunked ``ssd_chunked_reference``) are
written independently; most tests check a structural property of the recurrence on both.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference import (TOLERANCES, assert_close_scaled, chunk_cumsum_reference, process_dt, scaled_error,
                       ssd_chunked_reference, ssd_reference, ssd_reference_grads)
from reference.generators import hot_inputs, packed_inputs, packed_lengths, standard_inputs

REFERENCES = [ssd_reference, ssd_chunked_reference]
EXACT = 1e-12     # fp64 vs fp64: only summation order differs


def run(fn, inputs, chunk_size=8, **kwargs):
    return fn(**inputs, chunk_size=chunk_size, return_final_states=True, **kwargs)


# ---- dt processing ------------------------------------------------------------------------------

def test_process_dt_softplus_threshold_and_clamp():
    dt = torch.tensor([-30.0, -1.0, 0.0, 19.5, 20.0, 20.5, 60.0], dtype=torch.float64)
    got = process_dt(dt, dt_softplus=True)
    expected = torch.where(dt > 20, dt, torch.log1p(torch.exp(dt)))
    assert torch.equal(got, expected)
    assert torch.equal(process_dt(dt, dt_softplus=True, dt_limit=(0.5, 30.0)), expected.clamp(0.5, 30.0))
    assert torch.equal(process_dt(dt), dt.clamp(min=0.0))          # no softplus: Δ = clamp(dt, 0, inf)


def test_process_dt_gradient_sigmoid_and_zero_where_clamped():
    dt = torch.tensor([-3.0, -0.2, 0.4, 2.0, 25.0], dtype=torch.float64, requires_grad=True)
    bias = torch.tensor([0.1], dtype=torch.float64)
    process_dt(dt, bias, dt_softplus=True, dt_limit=(0.5, 2.0)).sum().backward()
    u = dt.detach() + bias
    sp = F.softplus(u, threshold=20)
    expected = torch.where((sp >= 0.5) & (sp <= 2.0), torch.sigmoid(u), torch.zeros(()))
    assert torch.allclose(dt.grad, expected, rtol=0, atol=1e-15)
    assert dt.grad[0] == 0 and dt.grad[4] == 0 and dt.grad[2] > 0


@pytest.mark.parametrize("seqlen,chunk_size", [(32, 8), (29, 8), (5, 16)])
def test_chunk_cumsum_matches_process_dt_and_cumsum(seqlen, chunk_size):
    inp = standard_inputs(2, seqlen, 3, 2, 2, dtype=torch.float16, seed=seqlen)
    dt_out, dA_cumsum = chunk_cumsum_reference(inp["dt"], inp["A"], chunk_size=chunk_size,
                                               dt_bias=inp["dt_bias"], dt_softplus=True)
    nchunks = math.ceil(seqlen / chunk_size)
    assert dt_out.shape == dA_cumsum.shape == (2, 3, nchunks, chunk_size)
    delta = process_dt(inp["dt"], inp["dt_bias"], True)
    A = inp["A"].double()
    for c in range(nchunks):
        valid = min(chunk_size, seqlen - c * chunk_size)
        block = delta[:, c * chunk_size:c * chunk_size + valid].permute(0, 2, 1)        # (B, H, valid)
        assert torch.equal(dt_out[:, :, c, :valid], block)
        assert torch.equal(dt_out[:, :, c, valid:], torch.zeros_like(dt_out[:, :, c, valid:]))
        running = torch.zeros(2, 3, dtype=torch.float64)
        for s in range(chunk_size):
            if s < valid:
                running = running + block[:, :, s] * A
            assert torch.allclose(dA_cumsum[:, :, c, s], running, rtol=1e-14, atol=0)


# ---- forward structure --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", REFERENCES)
@pytest.mark.parametrize("p", [0, 9, 23])
def test_causality(fn, p):
    inp = standard_inputs(1, 24, 2, 4, 3, dtype=torch.float32, seed=p, z=True)
    base = run(fn, inp)["out"]
    for name in ("x", "dt", "B", "C", "z"):
        perturbed = dict(inp)
        perturbed[name] = inp[name].clone()
        perturbed[name][:, p] += 0.5
        out = run(fn, perturbed)["out"]
        assert torch.equal(out[:, :p], base[:, :p]), f"{name}[{p}] changed an earlier output"
        assert not torch.equal(out[:, p], base[:, p]), f"{name}[{p}] did not change output {p}"


@pytest.mark.parametrize("fn", REFERENCES)
def test_matches_hand_written_scalar_recurrence(fn):
    """BRIEF §2 written out with Python floats for H = P = N = 1 (anchors both formulations)."""
    inp = standard_inputs(1, 7, 1, 1, 1, 1, torch.float32, seed=12, D="H", z=True, initial_states=True)
    got = run(fn, inp, 3)
    v = {k: (t.double().flatten().tolist() if isinstance(t, torch.Tensor) else t) for k, t in inp.items()}
    h = v["initial_states"][0]
    for t in range(7):
        u = v["dt"][t] + v["dt_bias"][0]
        delta = max(u if u > 20 else math.log1p(math.exp(u)), 0.0)
        h = math.exp(delta * v["A"][0]) * h + delta * v["x"][t] * v["B"][t]
        y = (h * v["C"][t] + v["D"][0] * v["x"][t]) * v["z"][t] / (1 + math.exp(-v["z"][t]))
        assert got["out"][0, t, 0, 0].item() == pytest.approx(y, rel=1e-13, abs=1e-300)
    assert got["final_states"].item() == pytest.approx(h, rel=1e-13)


@pytest.mark.parametrize("fn", REFERENCES)
def test_head_h_reads_group_h_div_heads_per_group(fn):
    H, G = 6, 3
    inp = standard_inputs(1, 9, H, 2, 2, G, torch.float32, seed=2)
    base = run(fn, inp)["out"]
    for g in range(G):
        for name in ("B", "C"):
            perturbed = {**inp, name: inp[name].clone()}
            perturbed[name][:, :, g] += 1.0
            changed = ((run(fn, perturbed)["out"] != base).sum((0, 1, 3)) > 0).tolist()
            assert changed == [h // (H // G) == g for h in range(H)], (name, g)


OPTION_SETS = {
    "plain": dict(D=None),
    "D_head_z": dict(D="H", z=True),
    "D_channel_init": dict(D="HP", initial_states=True),
    "all": dict(D="HP", z=True, initial_states=True),
}


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
@pytest.mark.parametrize("chunk_size", [1, 4, 8, 16, 64])
@pytest.mark.parametrize("ngroups", [1, 2])
def test_chunked_matches_sequential(options, chunk_size, ngroups):
    inp = standard_inputs(2, 29, 4, 4, 3, ngroups, torch.bfloat16, seed=chunk_size, **options)
    want = run(ssd_reference, inp, chunk_size, return_chunk_states=True)
    got = run(ssd_chunked_reference, inp, chunk_size, return_chunk_states=True)
    for key in ("out", "final_states", "chunk_states"):
        assert_close_scaled(got[key], want[key], EXACT, key)
    assert torch.equal(got["chunk_state_tokens"], want["chunk_state_tokens"])


@pytest.mark.parametrize("form", ["cu_seqlens", "seq_idx"])
@pytest.mark.parametrize("chunk_size", [4, 8, 16])
def test_chunked_matches_sequential_packed(form, chunk_size):
    inp = packed_inputs(4, 4, 3, 2, torch.float16, seed=chunk_size, chunk_size=chunk_size, D="HP", z=True)
    inp.pop("seq_idx" if form == "cu_seqlens" else "cu_seqlens")
    want = run(ssd_reference, inp, chunk_size, return_chunk_states=True)
    got = run(ssd_chunked_reference, inp, chunk_size, return_chunk_states=True)
    for key in ("out", "final_states", "chunk_states"):
        assert_close_scaled(got[key], want[key], EXACT, key)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 13), min_size=1, max_size=5), chunk_size=st.sampled_from([1, 2, 3, 4, 8]),
       ngroups=st.sampled_from([1, 2]), seed=st.integers(0, 2**16), D=st.sampled_from([None, "H", "HP"]),
       z=st.booleans())
def test_chunked_matches_sequential_property(lengths, chunk_size, ngroups, seed, D, z):
    inp = packed_inputs(2, 3, 2, ngroups, torch.float32, seed, chunk_size=chunk_size, lengths=lengths, D=D, z=z)
    inp.pop("seq_idx")
    want = run(ssd_reference, inp, chunk_size, return_chunk_states=True)
    got = run(ssd_chunked_reference, inp, chunk_size, return_chunk_states=True)
    for key in ("out", "final_states", "chunk_states"):
        assert_close_scaled(got[key], want[key], EXACT, key)


@pytest.mark.parametrize("fn", REFERENCES)
@pytest.mark.parametrize("split", [1, 7, 8, 20])
def test_split_and_carry_final_state_equals_one_run(fn, split):
    inp = standard_inputs(2, 21, 2, 4, 3, 2, torch.bfloat16, seed=split, D="H", z=True, initial_states=True)
    whole = run(fn, inp)
    first = run(fn, {k: (v[:, :split] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()})
    second = run(fn, {**{k: (v[:, split:] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()},
                      "initial_states": first["final_states"]})
    assert_close_scaled(torch.cat([first["out"], second["out"]], 1), whole["out"], EXACT, "out")
    assert_close_scaled(second["final_states"], whole["final_states"], EXACT, "final_states")


def separate_runs(fn, inp, cu_seqlens, chunk_size):
    """Run each packed sequence alone (B == 1) from its own initial state."""
    runs = []
    for i, (a, b) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        one = {k: (v[:, a:b] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()}
        one["initial_states"] = inp["initial_states"][i:i + 1]
        runs.append(run(fn, one, chunk_size))
    return runs


@pytest.mark.parametrize("fn", REFERENCES)
@pytest.mark.parametrize("form", ["cu_seqlens", "seq_idx"])
def test_packed_equals_separate_runs(fn, form):
    Q = 8
    inp = packed_inputs(2, 4, 3, 1, torch.bfloat16, seed=3, chunk_size=Q, D="HP", z=True)
    cu, seq_idx = inp.pop("cu_seqlens"), inp.pop("seq_idx")
    packed = run(fn, inp, Q, return_chunk_states=True, **({"cu_seqlens": cu} if form == "cu_seqlens"
                                                          else {"seq_idx": seq_idx}))
    alone = separate_runs(fn, inp, cu, Q)
    assert_close_scaled(packed["out"][0], torch.cat([r["out"][0] for r in alone]), EXACT, "out")
    assert_close_scaled(packed["final_states"], torch.cat([r["final_states"] for r in alone]), EXACT, "final")
    # Each chunk state is sequence chunk_state_seq's state after chunk_state_tokens of its tokens.
    for c in range(packed["chunk_states"].shape[1]):
        k, n = int(packed["chunk_state_seq"][0, c]), int(packed["chunk_state_tokens"][0, c])
        prefix = {key: (v[:, cu[k]:cu[k] + n] if key in ("x", "dt", "B", "C", "z") else v) for key, v in inp.items()}
        prefix["initial_states"] = inp["initial_states"][k:k + 1]
        assert_close_scaled(packed["chunk_states"][0, c], run(fn, prefix, Q)["final_states"][0], EXACT, f"chunk {c}")


def test_packed_generator_starts_mostly_inside_chunks():
    for Q in (8, 64, 256):
        lengths = packed_lengths(Q, seed=Q)
        assert {1, Q - 1, Q, Q + 1} <= set(lengths)
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)[1:]
        assert (starts % Q != 0).float().mean() > 0.5


@pytest.mark.parametrize("fn", REFERENCES)
def test_all_zero_seq_idx_equals_none(fn):
    inp = standard_inputs(3, 19, 2, 4, 3, 1, torch.float16, seed=5, D="H", initial_states=True)
    none = run(fn, inp, return_chunk_states=True)
    zero = run(fn, inp, return_chunk_states=True, seq_idx=torch.zeros(3, 19, dtype=torch.int32))
    for key in ("out", "final_states", "chunk_states"):
        assert torch.equal(zero[key], none[key]), key


@pytest.mark.parametrize("fn", REFERENCES)
def test_empty_sequence_keeps_initial_state(fn):
    inp = packed_inputs(2, 4, 3, 1, torch.float32, seed=1, chunk_size=4, lengths=[3, 5])
    inp.pop("seq_idx")
    inp["cu_seqlens"] = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    inp["initial_states"] = torch.randn(3, 2, 4, 3, generator=torch.Generator().manual_seed(0))
    got = run(fn, inp, 4)
    assert torch.equal(got["final_states"][1], inp["initial_states"][1].double())


def test_layout_errors():
    inp = standard_inputs(2, 6, 2, 2, 2, dtype=torch.float32)
    with pytest.raises(ValueError, match="non-decreasing"):
        ssd_reference(**inp, seq_idx=torch.tensor([[0, 0, 1, 1, 0, 0]] * 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="B == 1"):
        ssd_reference(**inp, cu_seqlens=torch.tensor([0, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="not both"):
        ssd_reference(**inp, seq_idx=torch.zeros(2, 6, dtype=torch.int32), cu_seqlens=torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="initial_states"):
        ssd_reference(**inp, initial_states=torch.zeros(1, 2, 2, 2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hot_inputs_stay_finite(dtype):
    inp = hot_inputs(2, 64, 3, 4, 3, 1, dtype, seed=7, D="H", z=True, initial_states=True)
    delta = process_dt(inp["dt"], inp["dt_bias"], True)
    assert bool((delta == 0).any()) and float(delta.max()) > 20 and float((delta * inp["A"].double()).min()) < -1e5
    want = run(ssd_reference, inp, 16, return_chunk_states=True)
    got = run(ssd_chunked_reference, inp, 16, return_chunk_states=True)
    for key in ("out", "final_states", "chunk_states"):
        assert torch.isfinite(want[key]).all() and torch.isfinite(got[key]).all(), key
        assert_close_scaled(got[key], want[key], EXACT, key)


def test_inputs_are_not_modified_and_numpy_accepted():
    inp = standard_inputs(1, 10, 2, 2, 2, dtype=torch.float32, seed=2, z=True, initial_states=True)
    before = {k: v.clone() for k, v in inp.items() if isinstance(v, torch.Tensor)}
    as_numpy = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    a = run(ssd_reference, inp)
    b = run(ssd_reference, as_numpy)
    assert torch.equal(a["out"], b["out"])
    for k, v in before.items():
        assert torch.equal(inp[k], v), k


# ---- comparison helpers ------------------------------------------------------------------------

def test_assert_close_scaled_reports_nan_inf_by_name_and_scales_by_rms():
    expected = torch.tensor([3.0, -4.0, 0.0, 0.0])                # rms = 2.5
    assert scaled_error(expected + torch.tensor([0.0, 0.5, 0.0, 0.0]), expected) == pytest.approx(0.2)
    assert_close_scaled(expected + 0.4, expected, 0.2, "ok")
    with pytest.raises(AssertionError, match="dz: scaled error"):
        assert_close_scaled(expected + 0.6, expected, 0.2, "dz")
    with pytest.raises(AssertionError, match="out: 1 NaN/Inf values in actual"):
        assert_close_scaled(torch.tensor([1.0, float("nan"), 0.0, 0.0]), expected, 1e9, "out")
    with pytest.raises(AssertionError, match="states: 1 NaN/Inf"):
        assert_close_scaled(torch.tensor([1.0, float("inf"), 0.0, 0.0]), expected, 1e9, "states")


@pytest.mark.parametrize("io", ["bf16", "fp16"])
def test_tolerances_pass_an_emulated_kernel_and_fail_an_off_by_one(io):
    """The documented bounds admit the precision emulation they were measured from and reject a
    typical indexing bug (C read one token late)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[io]
    inp = standard_inputs(1, 96, 2, 16, 16, 1, dtype, seed=21, D="H", z=True, initial_states=True)
    want = ssd_reference(**inp, return_final_states=True)
    emulate = dict(chunk_size=32, compute_dtype=torch.float32, operand_dtype=dtype, return_final_states=True)
    kernel = ssd_chunked_reference(**inp, **emulate)
    assert_close_scaled(kernel["out"].to(dtype), want["out"], TOLERANCES[io]["out"], "out")
    assert_close_scaled(kernel["final_states"], want["final_states"], TOLERANCES[io]["states"], "final_states")
    buggy = ssd_chunked_reference(**{**inp, "C": torch.roll(inp["C"], 1, dims=1)}, **emulate)
    assert scaled_error(buggy["out"].to(dtype), want["out"]) > 3 * TOLERANCES[io]["out"]


# ---- gradients ----------------------------------------------------------------------------------

def tiny_leaves(packed):
    gen = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(s, generator=gen, dtype=torch.float64)  # noqa: E731
    B, L, H, P, N, G = 1, 6, 2, 2, 3, 1
    nseq = 2 if packed else B
    leaves = dict(x=r(B, L, H, P), dt=0.5 * r(B, L, H), A=-torch.rand(H, generator=gen, dtype=torch.float64) - 0.5,
                  B=r(B, L, G, N), C=r(B, L, G, N), D=r(H, P), z=r(B, L, H, P),
                  dt_bias=torch.full((H,), -1.0, dtype=torch.float64), initial_states=r(nseq, H, P, N))
    return {k: v.requires_grad_(True) for k, v in leaves.items()}


@pytest.mark.parametrize("packed", [False, True])
def test_gradients_match_finite_differences(packed):
    leaves = tiny_leaves(packed)
    names = list(leaves)
    extra = dict(cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32)) if packed else {}

    def f(*tensors):
        kw = dict(zip(names, tensors))
        res = ssd_reference(**kw, dt_softplus=True, dt_limit=(0.0, 5.0), return_final_states=True, **extra)
        return res["out"], res["final_states"]

    assert torch.autograd.gradcheck(f, tuple(leaves.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_chunked_gradients_match_sequential():
    inp = standard_inputs(1, 13, 2, 3, 2, 1, torch.float32, seed=4, D="HP", z=True, initial_states=True)
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(1, 13, 2, 3, generator=gen, dtype=torch.float64)
    dfinal = torch.randn(1, 2, 3, 2, generator=gen, dtype=torch.float64)
    seq = ssd_reference_grads(dout, **inp, dfinal_states=dfinal)
    chk = ssd_reference_grads(dout, **inp, dfinal_states=dfinal, chunked=True, chunk_size=4)
    assert set(seq) == {"dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states"}
    for k in seq:
        assert_close_scaled(chk[k], seq[k], 1e-11, k)


def test_gradient_is_zero_where_dt_is_clamped():
    inp = standard_inputs(1, 12, 2, 2, 2, dtype=torch.float32, seed=9)
    lo = 0.05
    grads = ssd_reference_grads(torch.ones(1, 12, 2, 2, dtype=torch.float64), **inp, dt_limit=(lo, math.inf))
    clamped = F.softplus(inp["dt"].double() + inp["dt_bias"].double(), threshold=20) < lo
    assert bool(clamped.any()) and bool((~clamped).any())
    assert torch.all(grads["ddt"][clamped] == 0)
    assert torch.all(grads["ddt"][~clamped] != 0)
