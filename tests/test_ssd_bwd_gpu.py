"""ssd_bwd on the GPU against fp64 autograd through the oracle (every gradient, on the same rounded inputs).

Needs a CUDA device and the ssd_fwd + ssd_bwd_* cubins (``scons`` output or installed wheels); see tests/conftest.py.
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from built_variants import built_constants, require_built  # noqa: E402
from reference import generators  # noqa: E402

FORWARD_KEYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "initial_states", "seq_idx",
                "cu_seqlens")
GRADS = {"x": "dx", "dt": "ddt", "A": "dA", "B": "dB", "C": "dC", "D": "dD", "z": "dz", "dt_bias": "ddt_bias",
         "initial_states": "dinitial_states"}


def _runtime():
    from mamba2_aot import runtime
    return runtime


def _require(P, N, io="bf16", st="fp32"):
    """Skip unless the backward's steps are built for (P, N, io dtype, state dtype): the CI matrix, for one, builds
    ssd_bwd_chunk at N 256 and not the walks."""
    require_built("ssd_fwd_states", headdim=P, d_state=N, io_dtype=io, state_dtype=st)
    require_built("ssd_bwd_dstates", headdim=P, d_state=N, io_dtype=io)
    require_built("ssd_bwd_chunk", headdim=P, d_state=N, io_dtype=io, state_dtype=st)


def _num_seqs(inputs):
    if "cu_seqlens" in inputs:
        return inputs["cu_seqlens"].shape[0] - 1
    if "seq_idx" in inputs:
        return int(inputs["seq_idx"].max()) + 1
    return inputs["x"].shape[0]


def _backward(inputs, dout, dfinal_states=None, *, want_dinitial=True, **extra):
    """Launch ssd_bwd on CUDA copies of ``inputs``; returns the gradients (CPU) and the workspace size."""
    cuda = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items() if k in FORWARD_KEYS}
    x = cuda["x"]
    grads = {GRADS[k]: torch.full_like(cuda[k], float("nan")) for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")
             if k in cuda}
    if want_dinitial:
        batch, L, H, P = x.shape
        grads["dinitial_states"] = torch.full((_num_seqs(inputs), H, P, inputs["B"].shape[-1]), float("nan"),
                                              device="cuda")
    size = _runtime().workspace_size("ssd_bwd", x=x, B=cuda["B"])
    workspace = torch.full((size // 4,), float("nan"), device="cuda")
    _runtime().launch("ssd_bwd", **cuda, dout=dout.cuda(), workspace=workspace, **grads,
                      dfinal_states=None if dfinal_states is None else dfinal_states.cuda(), **extra)
    torch.cuda.synchronize()
    return {k: v.cpu() for k, v in grads.items()}, size


def _oracle(inputs, dout, dfinal_states=None, **extra):
    args = {k: v for k, v in inputs.items() if k in FORWARD_KEYS}
    return reference.ssd_reference_grads(dout, args.pop("x"), args.pop("dt"), args.pop("A"), args.pop("B"),
                                         args.pop("C"), dfinal_states=dfinal_states, chunked=True, chunk_size=64,
                                         **args, **extra)


def _check(got, ref, io="bf16"):
    tol = reference.TOLERANCES[io]["grads"]
    errors = {}
    for name, value in got.items():
        expected = ref.get(name)
        if expected is None:  # the gradient at a zero initial state (no initial_states given)
            continue
        errors[name] = reference.assert_close_scaled(value.float(), expected, tol, name)
    return errors


def _dout(inputs, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(inputs["x"].shape, generator=gen).to(inputs["x"].dtype)


def _dfinal(inputs, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    H, P, N = inputs["x"].shape[2], inputs["x"].shape[3], inputs["B"].shape[-1]
    return torch.randn(_num_seqs(inputs), H, P, N, generator=gen)


@pytest.fixture(params=[True, False], ids=["walks-in-one-launch", "walks-in-two-launches"])
def walk_launches(request, monkeypatch):
    """The recompute and the reverse pass as one ssd_bwd_walks launch (what these small calls get) or as their own two
    launches (what calls that fill the GPU get): the plan's choice forced. Yields the grids it was asked about (a test
    checks that the choice was made)."""
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_bwd
    asked = []
    monkeypatch.setattr(dispatch, "_recent_calls", {})  # (no memoised call may skip the plan)
    monkeypatch.setattr(ssd_bwd, "walks_side_by_side", lambda grid: asked.append(grid) or request.param)
    yield asked


@pytest.mark.parametrize("P,N,G", [(64, 128, 2), (64, 64, 1), (128, 128, 1), (128, 64, 2), (64, 256, 2),
                                   (128, 256, 1)])
def test_every_gradient_with_every_option(P, N, G, walk_launches):
    _require(P, N)
    inputs = generators.standard_inputs(2, 300, 4, P, N, G, torch.bfloat16, seed=P + N + G, D="HP", z=True,
                                        initial_states=True)
    dout, dfinal = _dout(inputs, 1), _dfinal(inputs, 1)
    got, _ = _backward(inputs, dout, dfinal)
    from mamba2_aot.plans.ssd_bwd import WALKS_D_STATES  # (N 256 has no ssd_bwd_walks: nothing to choose)
    assert bool(walk_launches) == (N in WALKS_D_STATES), "the plan did not choose how to launch the walks"
    _check(got, _oracle(inputs, dout, dfinal))


@pytest.mark.parametrize("L", [1, 63, 65, 165])
@pytest.mark.parametrize("D", ["H", None])
def test_lengths_and_optional_inputs(L, D):
    _require(64, 64)
    inputs = generators.standard_inputs(1, L, 2, 64, 64, 1, torch.bfloat16, seed=L, D=D)
    del inputs["dt_bias"]
    dout = _dout(inputs, L)
    got, _ = _backward(inputs, dout, want_dinitial=False)
    _check(got, _oracle(inputs, dout))


def test_zero_padded_run_has_the_same_gradients():
    """Tokens appended with x = B = C = dout = 0 change no gradient of the first L tokens (no dfinal_states)."""
    _require(64, 64)
    L, pad = 2 * 64 + 37, 27
    inputs = generators.standard_inputs(1, L, 2, 64, 64, 1, torch.bfloat16, seed=5, D="H", z=True)
    dout = _dout(inputs, 5)
    padded = dict(inputs)
    for k in ("x", "B", "C", "z"):
        padded[k] = torch.cat([inputs[k], torch.zeros_like(inputs[k][:, :pad])], dim=1)
    padded["dt"] = torch.cat([inputs["dt"], torch.zeros_like(inputs["dt"][:, :pad])], dim=1)
    got, _ = _backward(inputs, dout, want_dinitial=False)
    got_padded, _ = _backward(padded, torch.cat([dout, torch.zeros_like(dout[:, :pad])], dim=1), want_dinitial=False)
    for name, value in got.items():
        other = got_padded[name]
        if name in ("dx", "ddt", "dB", "dC", "dz"):
            other = other[:, :L]
        reference.assert_close_scaled(other.float(), value.float(), 1e-6, name)


@pytest.mark.parametrize("dt_limit", [(0.0, math.inf), (0.0, 50.0)])
def test_hot_inputs(dt_limit):
    _require(64, 128)
    inputs = generators.hot_inputs(1, 256, 4, 64, 128, 2, torch.bfloat16, seed=3, D="H", z=True, initial_states=True)
    dout, dfinal = _dout(inputs, 3), _dfinal(inputs, 3)
    got, _ = _backward(inputs, dout, dfinal, dt_limit=dt_limit)
    ref = _oracle(inputs, dout, dfinal, dt_limit=dt_limit)
    # dA: every term carries a decay e^(Δ·A) with |Δ·A| >= 2000 here (zero in fp32 and in fp64), so the true dA is 0;
    # the reference's ~1e-8 is its own rounding, a relative error to it means nothing. Bound it at ddt's scale.
    dA, ref_dA = got.pop("dA"), ref.pop("dA")
    assert torch.isfinite(dA).all()
    assert (dA.double() - ref_dA).abs().max() <= 1e-6 * ref["ddt"].square().mean().sqrt()
    _check(got, ref)


@pytest.mark.parametrize("lengths", [None, [1, 63, 64, 1]], ids=["lengths-from-the-generator", "ends-at-block-ends"])
@pytest.mark.parametrize("packing", ["cu_seqlens", "seq_idx"])
def test_packed_sequences(packing, lengths, walk_launches):
    """Sequences starting inside 64-token blocks; and sequences whose last token is a block's last row (the reverse
    walk learns of that end only from the next block's first row: with seq_idx it carried the next sequence's state
    gradient into this one)."""
    _require(64, 64)
    inputs = generators.packed_inputs(4, 64, 64, 2, torch.bfloat16, seed=11, chunk_size=64, lengths=lengths, D="H",
                                      z=True)
    del inputs["cu_seqlens" if packing == "seq_idx" else "seq_idx"]
    dout, dfinal = _dout(inputs, 11), _dfinal(inputs, 11)
    got, _ = _backward(inputs, dout, dfinal)
    assert walk_launches, "the plan did not choose how to launch the walks"
    _check(got, _oracle(inputs, dout, dfinal))


def test_seq_idx_rows_of_their_own(walk_launches):
    """seq_idx at batch 2, each row packing its own sequences, cut at other places (on a 64-token block's edge and
    beside it); every gradient but the per-sequence states' (those need batch 1)."""
    _require(64, 64)
    inputs = generators.standard_inputs(2, 200, 4, 64, 64, 2, torch.bfloat16, seed=72, D="H", z=True)
    inputs["seq_idx"] = generators.seq_idx_rows([40, 24, 136], [64, 1, 63, 72])
    dout = _dout(inputs, 72)
    got, _ = _backward(inputs, dout, want_dinitial=False)
    assert walk_launches, "the plan did not choose how to launch the walks"
    _check(got, _oracle(inputs, dout))


@pytest.mark.parametrize("N", [128, 256])
def test_packed_equals_separate_runs(N):
    """cu_seqlens with sequences starting inside blocks == each sequence run alone (batch 1, its own initial state and
    final-state gradient): dx, ddt, dz, dB, dC token by token, dinitial_states sequence by sequence, and dA, dD,
    ddt_bias as the sums of the separate runs'. Not bitwise (the blocks fall differently): each side is within the
    gradients' tolerance of the oracle, so they are within twice it of each other (fp16, whose bound is tighter)."""
    _require(64, N, "fp16")
    tol = 2 * reference.TOLERANCES["fp16"]["grads"]
    inputs = generators.packed_inputs(4, 64, N, 2, torch.float16, seed=51, chunk_size=64, lengths=[70, 1, 93, 64],
                                      D="HP", z=True)
    del inputs["seq_idx"]
    dout, dfinal = _dout(inputs, 51), _dfinal(inputs, 51)
    packed, _ = _backward(inputs, dout, dfinal)
    bounds = inputs["cu_seqlens"].tolist()
    sums = {}
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        alone = {k: v for k, v in inputs.items() if k != "cu_seqlens"}
        for k in ("x", "dt", "z", "B", "C"):
            alone[k] = inputs[k][:, start:end]
        alone["initial_states"] = inputs["initial_states"][i:i + 1]
        got, _ = _backward(alone, dout[:, start:end], dfinal[i:i + 1])
        for name in ("dx", "ddt", "dz", "dB", "dC"):
            reference.assert_close_scaled(packed[name][:, start:end], got[name], tol, f"{name} of sequence {i}")
        reference.assert_close_scaled(packed["dinitial_states"][i], got["dinitial_states"][0], tol,
                                      f"dinitial_states of sequence {i}")
        for name in ("dA", "dD", "ddt_bias"):
            sums[name] = sums.get(name, 0) + got[name].double()
    for name, total in sums.items():
        reference.assert_close_scaled(packed[name], total, tol, name)


def test_an_empty_sequence_gets_its_final_state_gradient():
    """cu_seqlens with an empty sequence: its final state is its initial state, so dinitial = dfinal exactly."""
    _require(64, 64)
    inputs = generators.packed_inputs(2, 64, 64, 1, torch.bfloat16, seed=21, chunk_size=64, lengths=[70, 0, 50],
                                      D="H")
    del inputs["seq_idx"]
    dout, dfinal = _dout(inputs, 21), _dfinal(inputs, 21)
    got, _ = _backward(inputs, dout, dfinal)
    _check(got, _oracle(inputs, dout, dfinal))
    assert torch.equal(got["dinitial_states"][1], dfinal[1])


@pytest.mark.parametrize("D", ["H", "HP"])
def test_an_empty_batch_writes_zero_sums_and_nothing_else(D):
    """Batch 0: dA, dD and ddt_bias are sums over no tokens, zero (written over NaN: only ssd_bwd_reduce runs);
    every other gradient is empty, and so is the workspace."""
    _require(64, 64)
    inputs = generators.standard_inputs(0, 100, 4, 64, 64, 1, torch.bfloat16, seed=5, D=D, z=True,
                                        initial_states=True)
    got, size = _backward(inputs, torch.zeros(0, 100, 4, 64, dtype=torch.bfloat16))
    assert size == 0
    sums = ("dA", "dD", "ddt_bias")
    for name in sums:
        assert got[name].numel() > 0 and torch.equal(got[name], torch.zeros_like(got[name])), name
    assert all(got[name].numel() == 0 for name in got if name not in sums)


def test_all_zero_seq_idx_equals_none():
    _require(64, 64)
    inputs = generators.standard_inputs(1, 200, 2, 64, 64, 1, torch.bfloat16, seed=2, D="H", z=True,
                                        initial_states=True)
    dout, dfinal = _dout(inputs, 2), _dfinal(inputs, 2)
    plain, _ = _backward(inputs, dout, dfinal)
    packed, _ = _backward({**inputs, "seq_idx": torch.zeros(1, 200, dtype=torch.int32)}, dout, dfinal)
    for name in plain:
        assert torch.equal(plain[name], packed[name]), name


def test_bitwise_deterministic_and_inputs_unchanged():
    _require(64, 128)
    inputs = generators.standard_inputs(2, 333, 4, 64, 128, 1, torch.bfloat16, seed=9, D="HP", z=True,
                                        initial_states=True)
    dout, dfinal = _dout(inputs, 9), _dfinal(inputs, 9)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    first, _ = _backward(inputs, dout, dfinal)
    for _ in range(9):
        again, _ = _backward(inputs, dout, dfinal)
        for name in first:
            assert torch.equal(first[name], again[name]), name
    for k, v in before.items():
        assert torch.equal(inputs[k], v), k


def test_real_model_head_layout():
    """Mamba-2 2.7B-like head layout (G1, many heads per group), shorter L; the workspace is reported."""
    _require(64, 128)
    inputs = generators.standard_inputs(1, 512, 16, 64, 128, 1, torch.bfloat16, seed=4, D="H", z=True)
    dout = _dout(inputs, 4)
    got, size = _backward(inputs, dout, want_dinitial=False)
    _check(got, _oracle(inputs, dout))
    assert size > 0


@pytest.mark.parametrize("target_ctas", [1, None], ids=["group-in-one-cta", "heads-split"])
def test_group_gradients_with_and_without_head_splits(target_ctas, monkeypatch):
    """dB and dC summed over a group's heads in one CTA, or in shares (the heads split over CTAs) that ssd_bwd_reduce
    adds: both against the oracle."""
    from mamba2_aot.plans import ssd_bwd
    _require(64, 128)
    if target_ctas is not None:
        monkeypatch.setattr(ssd_bwd, "TARGET_CTAS", target_ctas)
    assert ssd_bwd.head_splits(1, 4, 2, 6, 128) == (1 if target_ctas else 6)  # 4 blocks x 2 groups, 6 heads per group
    inputs = generators.standard_inputs(1, 200, 12, 64, 128, 2, torch.bfloat16, seed=21, D="H", z=True,
                                        initial_states=True)
    dout, dfinal = _dout(inputs, 21), _dfinal(inputs, 21)
    got, _ = _backward(inputs, dout, dfinal)
    _check(got, _oracle(inputs, dout, dfinal))


@pytest.mark.parametrize("packing", ["cu_seqlens", "seq_idx"])
def test_heads_walked_in_slices_of_P(packing, monkeypatch):
    """P128 N128: ssd_bwd_chunk walks each head as two 64-column slices of P (the whole head does not fit in shared
    memory), whose shares of ddt, dA and ddt_bias it adds. Packed sequences starting inside blocks (several runs per
    block, so several state loads per slice), two groups with their heads split over CTAs, dt_bias, D (H, P), z,
    initial and final states: every gradient against the oracle, and bitwise equal on a second run."""
    from mamba2_aot.plans import ssd_bwd
    _require(128, 128)
    monkeypatch.setattr(ssd_bwd, "TARGET_CTAS", 10**6)  # (heads split over CTAs: each split holds whole heads)
    inputs = generators.packed_inputs(8, 128, 128, 2, torch.bfloat16, seed=31, chunk_size=64, lengths=[70, 1, 93, 64],
                                      D="HP", z=True)
    del inputs["cu_seqlens" if packing == "seq_idx" else "seq_idx"]
    assert ssd_bwd.head_splits(1, 4, 2, 4, 128) > 1
    dout, dfinal = _dout(inputs, 31), _dfinal(inputs, 31)
    got, _ = _backward(inputs, dout, dfinal)
    _check(got, _oracle(inputs, dout, dfinal))
    again, _ = _backward(inputs, dout, dfinal)
    for name in got:
        assert torch.equal(got[name], again[name]), name


@pytest.mark.parametrize("P,packing,z,pool,target_ctas", [(64, "cu_seqlens", True, False, 10**6),
                                                           (64, "seq_idx", False, True, 1),
                                                           (128, "cu_seqlens", False, True, 10**6)])
def test_d_state_256_in_two_parts_of_N(P, packing, z, pool, target_ctas, monkeypatch):
    """N 256: each group's columns of N are split over two ssd_bwd_chunk CTAs whose shares of dx, dz and ddt (and
    partials of dA / ddt_bias; dD's are the first part's) ssd_bwd_reduce adds. Packed sequences starting inside
    blocks, two groups with their heads split over CTAs or not (dB and dC written by the chunk pass itself), dt_bias,
    D (H, P), with and without z, initial states read from a pool by index or per sequence, final states: every
    gradient against the oracle, and bitwise equal on a second run."""
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_bwd
    _require(P, 256)
    monkeypatch.setattr(dispatch, "_recent_calls", {})  # (no memoised call may skip the plan)
    monkeypatch.setattr(ssd_bwd, "TARGET_CTAS", target_ctas)
    inputs = generators.packed_inputs(4, P, 256, 2, torch.bfloat16, seed=41 + P, chunk_size=64,
                                      lengths=[70, 1, 93, 64], D="HP", z=z)
    del inputs["cu_seqlens" if packing == "seq_idx" else "seq_idx"]
    assert ssd_bwd.d_state_splits(256) == 2
    assert (ssd_bwd.head_splits(1, 4, 2, 2, 256) > 1) == (target_ctas > 1)
    dout, dfinal = _dout(inputs, 41), _dfinal(inputs, 41)
    extra = {}
    if pool:  # the initial states as slots of a larger pool, in another order
        states = inputs["initial_states"]
        slots = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
        pool_states = torch.randn((7,) + states.shape[1:], generator=torch.Generator().manual_seed(P))
        pool_states[slots.long()] = states
        inputs = {**inputs, "initial_states": pool_states}
        extra = {"initial_state_indices": slots.cuda()}
    got, _ = _backward(inputs, dout, dfinal, **extra)
    oracle_inputs = {**inputs, "initial_states": inputs["initial_states"][slots.long()]} if pool else inputs
    _check(got, _oracle(oracle_inputs, dout, dfinal))
    again, _ = _backward(inputs, dout, dfinal, **extra)
    for name in got:
        assert torch.equal(got[name], again[name]), name


def test_few_ctas_over_a_long_length():
    """Few CTAs over a long L (a forward call this shape would be split along L; the backward's recompute is the
    states-only walk, never split): every gradient against the oracle."""
    from mamba2_aot.plans import ssd_fwd
    _require(64, 128)
    inputs = generators.standard_inputs(1, 1100, 4, 64, 128, 2, torch.bfloat16, seed=23, D="HP", z=True,
                                        initial_states=True)
    assert ssd_fwd.plan_segments(1, 1100, 4, 64, 128)[0] > 2
    dout, dfinal = _dout(inputs, 23), _dfinal(inputs, 23)
    got, _ = _backward(inputs, dout, dfinal)
    _check(got, _oracle(inputs, dout, dfinal))


@pytest.mark.parametrize("constants", built_constants("ssd_bwd_chunk"),
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_every_built_variant(constants):
    """Each built (P, N, I/O dtype, state dtype): every gradient, initial states in the state dtype."""
    P, N, io, st = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    _require(P, N, io, st)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    inputs = generators.standard_inputs(1, 130, 2, P, N, 1, dtypes[io], seed=P + N, D="H", z=True,
                                        initial_states=True)
    inputs["initial_states"] = inputs["initial_states"].to(dtypes[st])
    dout, dfinal = _dout(inputs, 13), _dfinal(inputs, 13)
    got, _ = _backward(inputs, dout, dfinal)
    _check(got, _oracle(inputs, dout, dfinal), io)
