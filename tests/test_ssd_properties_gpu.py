"""ssd_fwd and ssd_bwd on the GPU against the fp64 oracle over drawn combinations of every option (hypothesis).

The parametrized tests in tests/test_ssd_fwd_gpu.py and tests/test_ssd_bwd_gpu.py each vary one or two options
around a fixed call; here every option is drawn at once, so that the combinations those grids leave out run too:
the built variant, heads and groups, batch or packed sequences (cu_seqlens with empty sequences, or seq_idx),
lengths that end inside a block, on its edge or beside it, chunk size, D's shape, z, dt_bias, softplus, dt_limit,
initial states (from a pool by slot, in the variant's state dtype), final and chunk states, a workspace (so long calls
split along L), the walk (a head per CTA), heads in pairs wherever a pair can run, or the plan's own choice, dt / x /
z / B / C as column views of one fused projection, and the hot generator. Each example also checks that no input was
written and that pool slots not named were left alone.

The draws are derandomized (the same examples every run); a failure prints the falsifying draw. Needs a CUDA
device and the built cubins; see tests/conftest.py.
"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")  # (requirements/test.txt has it; a bare GPU image may not)
pytestmark = pytest.mark.gpu

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import reference  # noqa: E402
from built_variants import built_constants, is_built  # noqa: E402
from reference import generators  # noqa: E402
from test_ssd_bwd_gpu import _backward, _check as _check_grads, _num_seqs, _oracle as _oracle_grads  # noqa: E402
from test_ssd_fwd_gpu import TORCH_DTYPES, _oracle, _run  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DT_LIMITS = [(0.0, float("inf")), (0.0, 0.1), (1e-3, 0.2), (0.0, 50.0)]
BLOCK = 64  # the tokens a walk's step covers (kernel_src/ssd_tiles.TILE)


def _backward_constants():
    """ssd_bwd_chunk's built constants whose other steps are built too (its state dtype is the initial states')."""
    return [c for c in built_constants("ssd_bwd_chunk")
            if is_built("ssd_fwd_states", **c) and is_built("ssd_bwd_dstates", headdim=c["headdim"],
                                                            d_state=c["d_state"], io_dtype=c["io_dtype"])]


@st.composite
def packed_lengths(draw, shortest, longest):
    """1..4 sequence lengths from [shortest, longest], not all zero. About half are stretched (by up to a block) to
    end on a 64-token block's edge or a token either side of it, where a chunk of 128 or 256 may end too: there a walk
    that sees one block at a time meets the next sequence (the backward once carried one sequence's state gradient
    into the one before it there)."""
    lengths, end = [], 0
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(shortest, longest))
        if draw(st.booleans()):
            n = max(-(-(end + n) // BLOCK) * BLOCK + draw(st.sampled_from([-1, 0, 1])) - end, shortest)
        lengths.append(n)
        end += n
    assume(end > 0)
    return lengths


def draw_dt_bias_and_softplus(draw, inputs):
    """Keep the generator's dt_bias in ``inputs`` or drop it, and draw dt_softplus (``draw``: a composite's draw or
    ``data.draw``). Without softplus the bias, Δ's inverse softplus, becomes Δ itself."""
    if not draw(st.booleans()):
        del inputs["dt_bias"]
    inputs["dt_softplus"] = draw(st.booleans())
    if not inputs["dt_softplus"] and "dt_bias" in inputs:
        inputs["dt_bias"] = torch.nn.functional.softplus(inputs["dt_bias"])


@st.composite
def problems(draw, constants, *, max_len, max_heads, generators_=("standard", "hot")):
    """A drawn call: (constants, inputs on the CPU, options). Packed calls are batch 1 with cu_seqlens (sequences may
    be empty) or seq_idx; the others batch 1..3."""
    c = draw(st.sampled_from(constants))
    P, N, io = c["headdim"], c["d_state"], TORCH_DTYPES[c["io_dtype"]]
    H = draw(st.integers(1, max_heads))
    G = draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]))
    chunk_size = draw(st.sampled_from([64, 128, 256]))
    packing = draw(st.sampled_from([None, None, "cu_seqlens", "seq_idx"]))
    generator = {"standard": generators.standard_inputs, "hot": generators.hot_inputs}[
        draw(st.sampled_from(generators_))]
    shapes = dict(D=draw(st.sampled_from([None, "H", "HP"])), z=draw(st.booleans()))
    seed = draw(st.integers(0, 2**16))
    if packing:
        lengths = draw(packed_lengths(0 if packing == "cu_seqlens" else 1, max_len // 3))
        inputs = generators.packed_inputs(H, P, N, G, io, seed, chunk_size=chunk_size, lengths=lengths,
                                          generator=generator, **shapes)
        del inputs["seq_idx" if packing == "cu_seqlens" else "cu_seqlens"]
    else:
        batch = draw(st.integers(1, 3))
        long = draw(st.booleans())  # (long rows and a workspace: the call is split along L)
        L = draw(st.integers(max_len // 2, max_len) if long else st.integers(1, max_len // 3))
        inputs = generator(batch, L, H, P, N, G, io, seed, initial_states=True, **shapes)
    if not draw(st.booleans()):
        del inputs["initial_states"]
    draw_dt_bias_and_softplus(draw, inputs)
    options = dict(chunk_size=chunk_size, dt_limit=draw(st.sampled_from(DT_LIMITS)))
    return c, inputs, options


def _fused_projection(inputs):
    """x, z, B, C and dt copied into column slices of one (batch, L, width) CUDA buffer, rows padded to 16 bytes."""
    present = [k for k in ("z", "x", "B", "C", "dt") if k in inputs]
    widths = {k: inputs[k][0, 0].numel() for k in present}
    batch, L = inputs["x"].shape[:2]
    row = -(-sum(widths.values()) // 8) * 8 + 8
    buf = torch.zeros(batch, L, row, dtype=inputs["x"].dtype, device="cuda")
    views, offset = {}, 0
    for k in present:
        trailing = inputs[k].shape[2:]
        strides = (L * row, row) + tuple(torch.empty(trailing).stride())
        views[k] = buf.as_strided(inputs[k].shape, strides, offset)
        views[k].copy_(inputs[k])
        offset += widths[k]
    return views


def _state_tolerance(c):
    tol = reference.TOLERANCES[c["io_dtype"]]["states"]
    return tol if c["state_dtype"] == "fp32" else tol + reference.TOLERANCES[f"pool_{c['state_dtype']}"]["states"]


@SETTINGS
@given(problem=problems(built_constants("ssd_fwd") or [{}], max_len=1300, max_heads=6), data=st.data())
def test_forward_matches_oracle_over_drawn_options(problem, data):
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_fwd
    c, inputs, options = problem
    state_dtype = TORCH_DTYPES[c["state_dtype"]]
    num_seqs = _num_seqs(inputs)
    H, P, N = inputs["x"].shape[2], inputs["x"].shape[3], inputs["B"].shape[-1]
    pooled = "initial_states" in inputs and data.draw(st.booleans(), "pools by slot")
    final = not pooled and data.draw(st.booleans(), "final_states")
    chunks = data.draw(st.booleans(), "chunk_states")
    workspace = data.draw(st.booleans(), "workspace")
    pairs = data.draw(st.sampled_from([None, False, True]), "paired_pays (None: the plan's choice)")
    strided = data.draw(st.booleans(), "fused projection views")
    cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    oracle_inputs = dict(inputs)
    extra = dict(options)
    if "initial_states" in cuda:
        cuda["initial_states"] = cuda["initial_states"].to(state_dtype)
        oracle_inputs["initial_states"] = cuda["initial_states"].cpu()
    if pooled:
        slots = num_seqs + data.draw(st.integers(0, 3), "spare slots")
        reads = data.draw(st.lists(st.integers(-1, slots), min_size=num_seqs, max_size=num_seqs), "read slots")
        order = data.draw(st.permutations(range(slots)), "write slots")
        skip = data.draw(st.lists(st.booleans(), min_size=num_seqs, max_size=num_seqs), "writes skipped")
        writes = [-1 if s else w for w, s in zip(order, skip)]
        initial_pool = torch.randn(slots, H, P, N, device="cuda").to(state_dtype)
        final_pool = torch.randn(slots, H, P, N, device="cuda").to(state_dtype)
        pool_before, initial_before = final_pool.clone(), initial_pool.clone()
        zero = torch.zeros(H, P, N)
        oracle_inputs["initial_states"] = torch.stack(
            [initial_pool[r].float().cpu() if 0 <= r < slots else zero for r in reads])
        del cuda["initial_states"]
        extra.update(initial_states=initial_pool, final_states=final_pool,
                     initial_state_indices=torch.tensor(reads, dtype=torch.int32, device="cuda"),
                     final_state_indices=torch.tensor(writes, dtype=torch.int32, device="cuda"))
    if strided:
        cuda.update(_fused_projection(cuda))
    before = {k: v.clone() for k, v in cuda.items() if isinstance(v, torch.Tensor)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "_recent_calls", {})
        if pairs is not None:
            mp.setattr(ssd_fwd, "paired_pays", lambda _: pairs)
        got = _run(cuda, final=final, chunks=chunks, state_dtype=state_dtype, workspace=workspace, **extra)
    ref = _oracle(oracle_inputs, final=True, chunks=chunks, **options)

    tol = reference.TOLERANCES[c["io_dtype"]]
    reference.assert_close_scaled(got["out"].cpu(), ref["out"], tol["out"], "out")
    if chunks:
        reference.assert_close_scaled(got["chunk_states"].cpu(), ref["chunk_states"], tol["states"], "chunk_states")
    if final:
        reference.assert_close_scaled(got["final_states"].float().cpu(), ref["final_states"], _state_tolerance(c),
                                      "final_states")
    if pooled:
        for seq, slot in enumerate(writes):
            if slot >= 0:
                reference.assert_close_scaled(final_pool[slot].float().cpu(), ref["final_states"][seq],
                                              _state_tolerance(c), f"final state of sequence {seq} in slot {slot}")
        for slot in sorted(set(range(slots)) - set(writes)):
            assert torch.equal(final_pool[slot], pool_before[slot]), f"pool slot {slot} was written"
        assert torch.equal(initial_pool, initial_before), "the initial states' pool was written"
    for k, v in before.items():
        assert torch.equal(v, cuda[k]), f"input {k} was written"


@SETTINGS
@given(problem=problems(_backward_constants() or [{}], max_len=200, max_heads=4, generators_=("standard",)),
       data=st.data())
def test_backward_matches_oracle_over_drawn_options(problem, data):
    """Every gradient. dinitial_states is asked for (and checked: the gradient at a zero state) even without
    initial_states. (The hot generator is left to tests/test_ssd_bwd_gpu.py::test_hot_inputs: its true dA is zero,
    which a scaled error cannot judge.)"""
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_bwd
    c, inputs, options = problem
    if "initial_states" in inputs:  # (the initial states' dtype picks the variant; without them, fp32's runs)
        inputs["initial_states"] = inputs["initial_states"].to(TORCH_DTYPES[c["state_dtype"]])
    del options["chunk_size"]  # (the backward's blocks are 64 tokens whatever the forward's chunk size)
    H, P, N = inputs["x"].shape[2], inputs["x"].shape[3], inputs["B"].shape[-1]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), "gradient seed"))
    dout = torch.randn(inputs["x"].shape, generator=gen).to(inputs["x"].dtype)
    dfinal = (torch.randn(_num_seqs(inputs), H, P, N, generator=gen) if data.draw(st.booleans(), "dfinal_states")
              else None)
    side_by_side = data.draw(st.booleans(), "walks in one launch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "_recent_calls", {})
        mp.setattr(ssd_bwd, "walks_side_by_side", lambda _: side_by_side)
        got, _ = _backward(inputs, dout, dfinal, **options)
    oracle_inputs = dict(inputs)
    oracle_inputs.setdefault("initial_states", torch.zeros(_num_seqs(inputs), H, P, N))
    ref = _oracle_grads(oracle_inputs, dout, dfinal, **options)
    assert set(got) <= set(ref)
    _check_grads(got, ref, c["io_dtype"])
