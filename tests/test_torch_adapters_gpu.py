"""mamba2_aot.torch: the drop-in functions against the oracle and (when its source is on the path) against
state-spaces/mamba's Triton functions on the same inputs; torch.compile(fullgraph=True) and CUDA-graph replay
give the eager results."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from reference import generators  # noqa: E402
from test_ssd_fwd_gpu import _to_cuda as _cuda  # noqa: E402

TOL = reference.TOLERANCES["bf16"]


def _adapters():
    from mamba2_aot import torch as adapters
    return adapters


def _forward_inputs(seed=0, **kw):
    inputs = _cuda(generators.standard_inputs(2, 300, 8, 64, 128, 2, torch.bfloat16, seed=seed, z=True, **kw))
    inputs.pop("dt_softplus")
    return inputs


def test_chunk_scan_combined_matches_the_oracle_and_triton():
    inputs = _forward_inputs(initial_states=True)
    out, final = _adapters().mamba_chunk_scan_combined(**inputs, chunk_size=128, dt_softplus=True,
                                                       return_final_states=True)
    ref = reference.ssd_reference(**inputs, dt_softplus=True, return_final_states=True)
    reference.assert_close_scaled(out.cpu(), ref["out"], TOL["out"], "out")
    reference.assert_close_scaled(final.cpu(), ref["final_states"], TOL["states"], "final_states")
    triton = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")
    t_out, t_final = triton.mamba_chunk_scan_combined(**inputs, chunk_size=128, dt_softplus=True,
                                                      return_final_states=True)
    reference.assert_close_scaled(out.cpu(), t_out.cpu(), TOL["out"], "out vs Triton")
    reference.assert_close_scaled(final.cpu(), t_final.cpu(), TOL["states"], "final_states vs Triton")


def test_varlen_states_with_cu_seqlens():
    inputs = _cuda(generators.packed_inputs(8, 64, 128, 2, torch.bfloat16, seed=3, chunk_size=64, z=True))
    inputs.pop("dt_softplus")
    seq_idx = inputs.pop("seq_idx")
    out, final, varlen = _adapters().mamba_chunk_scan_combined(**inputs, seq_idx=seq_idx, chunk_size=64,
                                                               dt_softplus=True, return_final_states=True,
                                                               return_varlen_states=True, state_dtype=torch.float32)
    ref = reference.ssd_reference(**inputs, dt_softplus=True, return_final_states=True)
    reference.assert_close_scaled(out.cpu(), ref["out"], TOL["out"], "out")
    reference.assert_close_scaled(varlen.cpu(), ref["final_states"], TOL["states"], "varlen_states")
    assert torch.equal(final, varlen[-1:])


def test_varlen_with_a_per_row_initial_state_as_triton_takes_it():
    """initial_states (1, H, P, N) with cu_seqlens: the first sequence starts from it, the others from zero."""
    inputs = _cuda(generators.packed_inputs(8, 64, 128, 2, torch.bfloat16, seed=4, chunk_size=64))
    inputs.pop("dt_softplus")
    row_state = inputs["initial_states"][:1].clone()
    inputs["initial_states"] = row_state
    out, varlen = _adapters().mamba_chunk_scan_combined(**inputs, chunk_size=64, dt_softplus=True,
                                                        return_varlen_states=True)
    per_seq = torch.zeros(inputs["cu_seqlens"].shape[0] - 1, *row_state.shape[1:], device="cuda")
    per_seq[0] = row_state[0]
    ref = reference.ssd_reference(**{**inputs, "initial_states": per_seq, "seq_idx": None}, dt_softplus=True,
                                  return_final_states=True)
    reference.assert_close_scaled(out.cpu(), ref["out"], TOL["out"], "out")
    reference.assert_close_scaled(varlen.cpu(), ref["final_states"], TOL["states"], "varlen_states")


def _decode_inputs(batch=4, H=8, P=64, N=128, G=2, seed=0):
    """Triton-style decode arguments: per-head A, dt, dt_bias, D expanded over (P[, N]) with stride 0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    A = -torch.exp(torch.rand(H, generator=g, device="cuda") * 2.0)
    dt = (0.5 * r(batch, H)).bfloat16()
    dt_bias, D = torch.rand(H, generator=g, device="cuda") - 3, r(H)
    return dict(x=r(batch, H, P).bfloat16(), dt=dt[..., None].expand(batch, H, P), A=A[:, None, None].expand(H, P, N),
                B=r(batch, G, N).bfloat16(), C=r(batch, G, N).bfloat16(), D=D[:, None].expand(H, P),
                z=r(batch, H, P).bfloat16(), dt_bias=dt_bias[:, None].expand(H, P), dt_softplus=True), \
        dict(A=A, dt=dt, dt_bias=dt_bias, D=D)


def test_selective_state_update_matches_the_oracle_and_triton():
    args, per_head = _decode_inputs()
    pool = torch.randn(10, 8, 64, 128, device="cuda")
    idx = torch.tensor([7, 2, 9, 0], dtype=torch.int32, device="cuda")
    ours_pool = pool.clone()
    out = _adapters().selective_state_update(ours_pool, **args, state_batch_indices=idx)
    oracle = {k: v for k, v in args.items() if k not in per_head}
    ref = reference.verify_update(pool.cpu(), idx.cpu(), **{k: v[:, None] if k in ("x", "B", "C", "z") else v
                                                            for k, v in oracle.items()},
                                  dt=per_head["dt"][:, None], A=per_head["A"], dt_bias=per_head["dt_bias"],
                                  D=per_head["D"], pool_dtype=torch.float32)
    reference.assert_close_scaled(out.cpu(), ref.out[:, 0], TOL["out"], "out")
    reference.assert_close_scaled(ours_pool.cpu(), ref.pool, reference.TOLERANCES["fp32"]["states"], "pool")
    triton = pytest.importorskip("mamba_ssm.ops.triton.selective_state_update")
    t_pool = pool.clone()
    t_out = triton.selective_state_update(t_pool, **args, state_batch_indices=idx)
    reference.assert_close_scaled(out.cpu(), t_out.cpu(), TOL["out"], "out vs Triton")
    reference.assert_close_scaled(ours_pool.cpu(), t_pool.cpu(), reference.TOLERANCES["fp32"]["states"],
                                  "pool vs Triton")


def test_torch_compile_fullgraph_and_cuda_graph_replay_give_the_eager_results():
    import mamba2_aot
    adapters = _adapters()
    inputs = _forward_inputs(seed=5)
    args, _ = _decode_inputs(seed=6)
    pool = torch.randn(4, 8, 64, 128, device="cuda")

    def step(inputs, args, pool):
        out = adapters.mamba_chunk_scan_combined(**inputs, chunk_size=64, dt_softplus=True)
        y = adapters.selective_state_update(pool, **args)
        return out, y

    eager_pool = pool.clone()
    eager = step(inputs, args, eager_pool)
    compiled_pool = pool.clone()
    compiled = torch.compile(step, fullgraph=True)(inputs, args, compiled_pool)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert torch.equal(eager_pool, compiled_pool)

    mamba2_aot.preload(["ssd_fwd", "verify"])
    graph_pool = pool.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step(inputs, args, graph_pool.clone())  # warm up the allocator on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = step(inputs, args, graph_pool)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)
    assert torch.equal(eager_pool, graph_pool)


def test_gradients_are_refused_not_silently_dropped():
    inputs = _forward_inputs(seed=7)
    inputs["x"] = inputs["x"].requires_grad_()
    with pytest.raises(NotImplementedError, match="ssd_bwd"):
        _adapters().mamba_chunk_scan_combined(**inputs, chunk_size=64, dt_softplus=True)
    with torch.no_grad():
        _adapters().mamba_chunk_scan_combined(**inputs, chunk_size=64, dt_softplus=True)


def test_causal_conv1d_fn_then_update_match_the_oracle():
    """causal_conv1d's calling convention (x (batch, dim, L) as a transposed view of Mamba-2's xBC, bf16 weights):
    a prefill with initial states, then two decode columns from its final states, against one fp64 conv."""
    batch, dim, L, K = 2, 200, 70, 4
    gen = torch.Generator().manual_seed(5)
    xBC = torch.randn(batch, L + 2, dim, generator=gen).bfloat16()
    weight = (torch.randn(dim, K, generator=gen) * 0.5).bfloat16()
    bias = (torch.randn(dim, generator=gen) * 0.1).bfloat16()
    initial = torch.randn(batch, dim, K - 1, generator=gen).bfloat16()
    adapters = _adapters()
    x = xBC[:, :L].cuda().transpose(1, 2)
    out, final = adapters.causal_conv1d_fn(x, weight.cuda(), bias.cuda(), initial_states=initial.cuda(),
                                           return_final_states=True, activation="silu")
    steps = [adapters.causal_conv1d_update(xBC[:, L + t].cuda(), final, weight.cuda(), bias.cuda(), activation="silu")
             for t in range(2)]
    ref = reference.conv1d_prefill(xBC, weight.float(), bias.float(), "silu", initial_conv_states=initial)
    conv_tol = reference.TOLERANCES["bf16"]["out"]
    reference.assert_close_scaled(out.transpose(1, 2).cpu(), ref["out"][:, :L], conv_tol, "causal_conv1d_fn out")
    reference.assert_close_scaled(torch.stack(steps, 1).cpu(), ref["out"][:, L:], conv_tol, "causal_conv1d_update")
    assert torch.equal(final.cpu().double(), ref["final_conv_states"]), "the state after decode: the last K-1 inputs"
