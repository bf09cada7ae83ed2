"""ssd_fwd on the GPU against the fp64 oracle (token-by-token recurrence on the same rounded inputs), every launch on
the walk (kernel_src/ssd_fwd.py) but a split call's states-only pass (kernel_src/ssd_fwd_pass.py):
tests/test_ssd_fwd_paired_gpu.py runs these tests again two heads per CTA (ssd_fwd_paired and ssd_fwd_inline).

Needs a CUDA device and the ssd_fwd cubins (``scons`` output or installed wheels); see tests/conftest.py.
"""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from built_variants import built_constants, require_built  # noqa: E402
from reference import generators  # noqa: E402

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INPUT_KEYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")


@pytest.fixture(autouse=True)
def _walk_only(monkeypatch):
    """No launch goes to ssd_fwd_paired, however many its CTAs. (Named with an underscore: the paired module imports
    this one's tests with ``*`` and must not get this fixture.)"""
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_fwd
    monkeypatch.setattr(dispatch, "_recent_calls", {})  # (no memoised call may skip the plan)
    monkeypatch.setattr(ssd_fwd, "paired_pays", lambda pairs: False)


def _runtime():
    from mamba2_aot import runtime
    return runtime


def _require(**constants):
    require_built("ssd_fwd", **constants)


def _to_cuda(inputs):
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _run(inputs, *, chunk_size=256, final=False, chunks=False, state_dtype=torch.float32, workspace=False, **extra):
    """Launch ssd_fwd on ``inputs`` (CUDA tensors; initial_states / seq_idx / cu_seqlens included when present);
    returns the outputs (out, and final_states / chunk_states when asked). ``workspace``: pass one of
    ``workspace_size`` bytes (so that a call with few CTAs is split along L)."""
    x = inputs["x"]
    batch, L, H, P = x.shape
    N = inputs["B"].shape[-1]
    kwargs = {k: inputs[k] for k in INPUT_KEYS if k in inputs}
    for k in ("initial_states", "seq_idx", "cu_seqlens"):
        if k in inputs:
            kwargs[k] = inputs[k]
    if "initial_states" in kwargs:
        kwargs["initial_states"] = kwargs["initial_states"].to(state_dtype)
    num_seqs = inputs["cu_seqlens"].shape[0] - 1 if "cu_seqlens" in inputs else (
        int(inputs["seq_idx"].max()) + 1 if "seq_idx" in inputs else batch)
    result = {"out": torch.full_like(x, float("nan"))}
    if final:
        result["final_states"] = torch.full((num_seqs, H, P, N), float("nan"), dtype=state_dtype, device="cuda")
    if chunks:
        result["chunk_states"] = torch.full((batch, -(-L // chunk_size), H, P, N), float("nan"), device="cuda")
    if workspace:
        size = _runtime().workspace_size("ssd_fwd", x=x, B=inputs["B"])
        extra["workspace"] = torch.full((size // 4,), float("nan"), device="cuda")
    _runtime().launch("ssd_fwd", chunk_size=chunk_size, dt_softplus=inputs.get("dt_softplus", False),
                      **kwargs, **result, **extra)
    torch.cuda.synchronize()
    return result


def _oracle(inputs, *, chunk_size=256, final=False, chunks=False, **extra):
    args = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return reference.ssd_reference(chunk_size=chunk_size, return_final_states=final, return_chunk_states=chunks,
                                   **args, **extra)


def _check(got, ref, io="bf16"):
    tol = reference.TOLERANCES[io]
    reference.assert_close_scaled(got["out"].cpu(), ref["out"], tol["out"], "out")
    for name in ("final_states", "chunk_states"):
        if name in got:
            reference.assert_close_scaled(got[name].float().cpu(), ref[name], tol["states"], name)


@pytest.mark.parametrize("P,N,G", [(64, 128, 2), (64, 64, 1), (64, 256, 4), (128, 128, 1), (128, 64, 2)])
def test_matches_oracle_with_every_option(P, N, G):
    _require(headdim=P, d_state=N, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(2, 300, 4, P, N, G, torch.bfloat16, seed=P + N + G, D="HP", z=True,
                                                 initial_states=True))
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    got = _run(inputs, chunk_size=128, final=True, chunks=True, dt_limit=(1e-3, 0.2))
    _check(got, _oracle(inputs, chunk_size=128, final=True, chunks=True, dt_limit=(1e-3, 0.2)))
    for k, v in before.items():
        assert torch.equal(v, inputs[k]), f"input {k} was written"


@pytest.mark.parametrize("L", [1, 63, 64, 65, 2 * 64 + 37])
@pytest.mark.parametrize("D", [None, "H"])
def test_lengths_and_optional_inputs(L, D):
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(3, L, 8, 64, 128, 2, torch.bfloat16, seed=L, D=D, z=D is None))
    _check(_run(inputs, chunk_size=64, final=True, chunks=True),
           _oracle(inputs, chunk_size=64, final=True, chunks=True))


def test_hot_inputs():
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.hot_inputs(2, 333, 8, 64, 128, 1, torch.bfloat16, seed=3, z=True,
                                            initial_states=True))
    got = _run(inputs, final=True, chunks=True)
    _check(got, _oracle(inputs, final=True, chunks=True))


@pytest.mark.parametrize("packing", ["cu_seqlens", "seq_idx"])
@pytest.mark.parametrize("Q", [64, 256])
def test_packed_sequences(packing, Q):
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = generators.packed_inputs(8, 64, 128, 2, torch.bfloat16, seed=Q, chunk_size=Q, z=True)
    inputs.pop("seq_idx" if packing == "cu_seqlens" else "cu_seqlens")
    inputs = _to_cuda(inputs)
    got = _run(inputs, chunk_size=Q, final=True, chunks=True)
    _check(got, _oracle(inputs, chunk_size=Q, final=True, chunks=True))


def test_seq_idx_rows_of_their_own():
    """seq_idx at batch 2: each row packs its own sequences, cut at other places (on a 64-token block's edge, beside
    it, on a chunk's edge); chunk states too (per-sequence states need batch 1)."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = generators.standard_inputs(2, 300, 4, 64, 128, 2, torch.bfloat16, seed=71, z=True)
    inputs["seq_idx"] = generators.seq_idx_rows([40, 88, 172], [64, 1, 63, 172])
    inputs = _to_cuda(inputs)
    _check(_run(inputs, chunk_size=128, chunks=True), _oracle(inputs, chunk_size=128, chunks=True))


def test_packed_equals_separate_runs_and_split_sequences_carry_states():
    """One packed call == each sequence alone; a sequence split in two calls (final -> initial) == one call."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.packed_inputs(8, 64, 128, 2, torch.bfloat16, seed=5, chunk_size=64,
                                               lengths=[70, 1, 130]))
    inputs.pop("seq_idx")
    packed = _run(inputs, chunk_size=64, final=True)
    cu = inputs["cu_seqlens"].tolist()
    for i, (s, e) in enumerate(zip(cu, cu[1:])):
        alone = {k: (v[:, s:e] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inputs.items()
                 if k not in ("cu_seqlens",)}
        alone["initial_states"] = inputs["initial_states"][i:i + 1]
        single = _run(alone, chunk_size=64, final=True)
        # not bitwise: a packed sequence's 64-token blocks sit at other offsets, so operands round elsewhere
        tol = reference.TOLERANCES["bf16"]
        reference.assert_close_scaled(packed["out"][:, s:e].cpu(), single["out"].cpu(), tol["out"], f"seq {i} out")
        reference.assert_close_scaled(packed["final_states"][i:i + 1].cpu(), single["final_states"].cpu(),
                                      tol["states"], f"seq {i} final state")

    whole = {k: v[:, :130] if k in ("x", "dt", "B", "C") else v for k, v in inputs.items() if k != "cu_seqlens"}
    whole["initial_states"] = inputs["initial_states"][:1]
    first = {k: v[:, :50] if k in ("x", "dt", "B", "C") else v for k, v in whole.items()}
    second = {k: v[:, 50:] if k in ("x", "dt", "B", "C") else v for k, v in whole.items()}
    one = _run(whole, final=True)
    a = _run(first, final=True)
    second["initial_states"] = a["final_states"]
    b = _run(second, final=True)
    ref = _oracle(whole, final=True)
    reference.assert_close_scaled(torch.cat([a["out"], b["out"]], 1).cpu(), ref["out"],
                                  reference.TOLERANCES["bf16"]["out"], "split out")
    reference.assert_close_scaled(b["final_states"].cpu(), one["final_states"].cpu(),
                                  reference.TOLERANCES["bf16"]["states"], "split final state")


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_state_pool_in_place(state_dtype):
    """Initial states read from and final states written to one pool by slot index, in place."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype=state_dtype)
    dtype = TORCH_DTYPES[state_dtype]
    inputs = _to_cuda(generators.standard_inputs(3, 200, 8, 64, 128, 2, torch.bfloat16, seed=9, z=True))
    pool = torch.randn(6, 8, 64, 128, device="cuda").to(dtype)
    before = pool.clone()
    read = torch.tensor([4, -1, 0], dtype=torch.int32, device="cuda")   # -1: start from zero
    write = torch.tensor([4, 2, -1], dtype=torch.int32, device="cuda")  # -1: not written
    out = torch.empty_like(inputs["x"])
    _runtime().launch("ssd_fwd", **{k: inputs[k] for k in INPUT_KEYS if k in inputs}, dt_softplus=True, out=out,
                      initial_states=pool, initial_state_indices=read, final_states=pool,
                      final_state_indices=write)
    torch.cuda.synchronize()
    initial = torch.stack([before[4].float(), torch.zeros(8, 64, 128, device="cuda"), before[0].float()])
    ref = _oracle({**inputs, "initial_states": initial}, final=True)
    tol = reference.TOLERANCES["bf16"]
    reference.assert_close_scaled(out.cpu(), ref["out"], tol["out"], "out")
    reference.assert_close_scaled(pool[4].float().cpu(), ref["final_states"][0], tol["states"], "slot 4")
    reference.assert_close_scaled(pool[2].float().cpu(), ref["final_states"][1], tol["states"], "slot 2")
    for untouched in (0, 1, 3, 5):
        assert torch.equal(pool[untouched], before[untouched]), f"slot {untouched} was written"


def test_fused_projection_views_and_64bit_batch_stride():
    """x, z, B, C and dt as column slices of one in_proj output whose batch stride passes 2^31 elements."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    batch, L, H, P, N, G = 2, 96, 8, 64, 128, 2
    width = 2 * H * P + 2 * G * N + H
    row_stride = width + 8                       # padded rows (a multiple of 8)
    batch_stride = (2**31 // row_stride + 1) * row_stride
    assert batch_stride > 2**31
    buf = torch.zeros(batch_stride + L * row_stride, dtype=torch.bfloat16, device="cuda")
    ref_inputs = generators.standard_inputs(batch, L, H, P, N, G, torch.bfloat16, seed=11, z=True)

    def column_view(offset, shape):
        strides = (batch_stride, row_stride) + tuple(torch.empty(shape[2:]).stride())
        return buf.as_strided(shape, strides, offset)

    views = {"z": column_view(0, (batch, L, H, P)), "x": column_view(H * P, (batch, L, H, P)),
             "B": column_view(2 * H * P, (batch, L, G, N)), "C": column_view(2 * H * P + G * N, (batch, L, G, N)),
             "dt": column_view(2 * H * P + 2 * G * N, (batch, L, H))}
    for k, v in views.items():
        v.copy_(ref_inputs[k])
    inputs = _to_cuda({k: v for k, v in ref_inputs.items() if k not in views})
    inputs.update(views)
    got = _run(inputs, final=True)
    _check(got, _oracle(_to_cuda(ref_inputs), final=True))


@pytest.mark.parametrize("shape", [
    pytest.param((80, 64, 128, 1, 256), id="mamba2-2.7b"),
    pytest.param((128, 64, 128, 8, 128), id="nemotron-h"),
    pytest.param((32, 128, 128, 1, 256), id="P128"),
    pytest.param((32, 64, 256, 4, 128), id="N256"),
])
def test_real_model_shapes(shape):
    H, P, N, G, Q = shape
    _require(headdim=P, d_state=N, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(1, 2 * Q + 37, H, P, N, G, torch.bfloat16, seed=H, z=True,
                                                 initial_states=True))
    got = _run(inputs, chunk_size=Q, final=True, chunks=True)
    _check(got, _oracle(inputs, chunk_size=Q, final=True, chunks=True))


def test_repeated_launches_are_bitwise_identical():
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(2, 500, 16, 64, 128, 4, torch.bfloat16, seed=2, z=True))
    first = _run(inputs, final=True)
    for _ in range(3):
        again = _run(inputs, final=True)
        assert torch.equal(again["out"], first["out"]) and torch.equal(again["final_states"], first["final_states"])


def _segments(inputs, chunk_size=64):
    from mamba2_aot.plans.ssd_fwd import plan_segments
    batch, L, H, P = inputs["x"].shape
    return plan_segments(batch, L, H, P, inputs["B"].shape[-1], chunk_size)[0]


def test_split_call_matches_oracle():
    """A call with few CTAs over a long L, split along L (a states-only pass, then the segments from their entering
    states), against the oracle: every option, initial and final states, chunk states; inputs unchanged."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(2, 1500, 4, 64, 128, 2, torch.bfloat16, seed=31, D="HP", z=True,
                                                 initial_states=True))
    assert _segments(inputs) == 5 and _segments(inputs, 256) == 3
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    for chunks in (False, True):  # the entering states in the workspace, or in chunk_states
        got = _run(inputs, chunk_size=256, final=True, chunks=chunks, workspace=True, dt_limit=(1e-3, 0.2))
        _check(got, _oracle(inputs, chunk_size=256, final=True, chunks=chunks, dt_limit=(1e-3, 0.2)))
        assert all(torch.isfinite(v).all() for v in got.values())
    for k, v in before.items():
        assert torch.equal(v, inputs[k]), f"input {k} was written"


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_split_call_reads_and_writes_pools_by_slot(state_dtype):
    """Split along L with separate initial and final pools by slot index (a negative and an out-of-range read
    start from zero; a negative write is skipped): bitwise the unsplit call, every other pool slot untouched."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype=state_dtype)
    dtype = TORCH_DTYPES[state_dtype]
    inputs = _to_cuda(generators.standard_inputs(3, 1500, 2, 64, 128, 1, torch.bfloat16, seed=41, z=True))
    assert _segments(inputs) > 1
    initial = torch.randn(6, 2, 64, 128, device="cuda").to(dtype)
    reads = torch.tensor([4, -1, 6], dtype=torch.int32, device="cuda")
    writes = torch.tensor([2, -1, 5], dtype=torch.int32, device="cuda")
    pool = torch.randn(6, 2, 64, 128, device="cuda").to(dtype)
    results = []
    for workspace in (False, True):
        final = pool.clone()
        got = _run(inputs, workspace=workspace, initial_states=initial,
                   initial_state_indices=reads, final_states=final, final_state_indices=writes)
        results.append((got["out"], final))
    (out, final), (split_out, split_final) = results
    assert torch.isfinite(out.float()).all() and torch.equal(split_out, out) and torch.equal(split_final, final)
    assert torch.equal(final[[0, 1, 3, 4]], pool[[0, 1, 3, 4]]) and not torch.equal(final[2], pool[2])


def test_handover_call_matches_oracle_and_the_unsplit_call_bitwise():
    """A call with more CTAs than the GPU runs at once, its rows cut into segments that hand their states over in
    one launch (flags in the workspace, which starts as NaN): against the oracle, and bitwise the unsplit call on
    two calls in a row (the runtime zeroes the flags before each; tests/test_ssd_fwd_plan.py checks that it does)."""
    from mamba2_aot.plans.ssd_fwd import plan_handover
    _require(headdim=128, d_state=128, io_dtype="bf16", state_dtype="fp32")
    inputs = _to_cuda(generators.standard_inputs(3, 1061, 45, 128, 128, 5, torch.bfloat16, seed=45, D="HP", z=True,
                                                 initial_states=True))
    assert plan_handover(3, 1061, 45, 128, 128) == (3, 384)  # 270 CTAs for 264 slots; the last segment 293 tokens
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    whole = _run(inputs, final=True, dt_limit=(1e-3, 0.2))
    for _ in range(2):
        split = _run(inputs, final=True, workspace=True, dt_limit=(1e-3, 0.2))
        for name, value in whole.items():
            assert torch.isfinite(value.float()).all(), name
            assert torch.equal(split[name], value), name
    _check(split, _oracle(inputs, final=True, dt_limit=(1e-3, 0.2)))
    for k, v in before.items():
        assert torch.equal(v, inputs[k]), f"input {k} was written"


@pytest.mark.parametrize("constants", built_constants("ssd_fwd"),
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in sorted(c.items())))
def test_handover_calls_equal_unsplit_calls_bitwise(constants):
    """Each built variant (both CTA shapes: d_state 256 runs one CTA per SM): a call over a wave of CTAs whose
    segments hand their states over gives bitwise the unsplit call's outputs and final states."""
    from mamba2_aot.plans.ssd_fwd import plan_handover
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    heads = (90 if N <= 128 else 46) * 64 // P  # 270 / 138 CTAs over 264 / 132 slots
    inputs = _to_cuda(generators.standard_inputs(3, 600, heads, P, N, 1, TORCH_DTYPES[io], seed=P + N, D="H", z=True,
                                                 initial_states=True))
    assert plan_handover(3, 600, heads, P, N)[0] > 1
    kw = dict(final=True, state_dtype=TORCH_DTYPES[state])
    whole, split = _run(inputs, **kw), _run(inputs, workspace=True, **kw)
    for name, value in whole.items():
        assert torch.isfinite(value.float()).all(), name
        assert torch.equal(split[name], value), name


@pytest.mark.parametrize("constants", built_constants("ssd_fwd"),
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in sorted(c.items())))
def test_split_calls_equal_unsplit_calls_bitwise(constants):
    """Each built variant: a call split along L (its states-only pass on ssd_fwd_pass, several chunk states in it)
    gives bitwise the unsplit call's outputs, final states and chunk states, for entering states kept in the
    workspace and in chunk_states."""
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    inputs = _to_cuda(generators.standard_inputs(1, 1100 + 37, 2, P, N, 1, TORCH_DTYPES[io], seed=N + P, D="H",
                                                 z=True, initial_states=True))
    assert _segments(inputs) > 2
    for chunks in (False, True):
        kw = dict(chunk_size=128, final=True, chunks=chunks, state_dtype=TORCH_DTYPES[state])
        whole, split = _run(inputs, **kw), _run(inputs, workspace=True, **kw)
        for name, value in whole.items():
            assert torch.isfinite(value.float()).all(), name
            assert torch.equal(split[name], value), f"{name} (chunk_states {'given' if chunks else 'not given'})"


@pytest.mark.parametrize("constants", built_constants("ssd_fwd"),
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in sorted(c.items())))
def test_every_built_variant(constants):
    """Each variant in the build (the full matrix in a full build) against the oracle, pool dtype included."""
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    dtype = TORCH_DTYPES[io]
    inputs = _to_cuda(generators.standard_inputs(2, 150, 4, P, N, 2, dtype, seed=N, D="H", z=True,
                                                 initial_states=True))
    inputs["initial_states"] = inputs["initial_states"].to(TORCH_DTYPES[state])
    got = _run(inputs, chunk_size=64, final=True, chunks=True, state_dtype=TORCH_DTYPES[state])
    ref = _oracle(inputs, chunk_size=64, final=True, chunks=True)
    tol = reference.TOLERANCES[io]
    reference.assert_close_scaled(got["out"].cpu(), ref["out"], tol["out"], "out")
    state_tol = tol["states"] if state == "fp32" else reference.TOLERANCES[f"pool_{state}"]["states"] + tol["states"]
    reference.assert_close_scaled(got["final_states"].float().cpu(), ref["final_states"], state_tol, "final_states")
    reference.assert_close_scaled(got["chunk_states"].cpu(), ref["chunk_states"], tol["states"], "chunk_states")


def test_prefill_into_a_pool_then_decode_equals_one_long_run():
    """ssd_fwd writes each sequence's final state into its slot of an fp32 state pool; verify then decodes from
    those slots with no conversion: prefill + 3 decode steps == the oracle over the whole sequence."""
    _require(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    batch, L, T, H, P, N, G = 3, 150, 3, 8, 64, 128, 2
    full = generators.standard_inputs(batch, L + T, H, P, N, G, torch.bfloat16, seed=21, z=True)
    rows = ("x", "dt", "B", "C", "z")
    prefill = _to_cuda({k: (v[:, :L] if k in rows else v) for k, v in full.items()})
    decode = _to_cuda({k: (v[:, L:] if k in rows else v) for k, v in full.items()})
    pool = torch.zeros(8, H, P, N, device="cuda")
    slots = torch.tensor([5, 0, 2], dtype=torch.int32, device="cuda")
    _runtime().launch("ssd_fwd", **{k: prefill[k] for k in INPUT_KEYS if k in prefill},
                      out=torch.empty_like(prefill["x"]), dt_softplus=True, final_states=pool,
                      final_state_indices=slots)
    out = torch.empty_like(decode["x"])
    _runtime().launch("verify", mode="update", state=pool, state_indices=slots, out=out, dt_softplus=True,
                      **{k: decode[k] for k in INPUT_KEYS if k in decode})
    torch.cuda.synchronize()
    ref = _oracle(_to_cuda(full), final=True)
    tol = reference.TOLERANCES["bf16"]
    reference.assert_close_scaled(out.cpu(), ref["out"][:, L:], tol["out"], "decoded out")
    reference.assert_close_scaled(pool[slots.long()].cpu(), ref["final_states"], tol["states"], "pool after decode")
