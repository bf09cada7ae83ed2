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


GRAD_LEAVES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def _grad_inputs(seed):
    inputs = _forward_inputs(seed=seed, initial_states=True)
    return {k: (v.detach().clone().requires_grad_() if k in GRAD_LEAVES else v) for k, v in inputs.items()}


def _loss_weights(inputs, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, state = inputs["x"], inputs["initial_states"]
    return (torch.randn(x.shape, generator=g, device="cuda").to(x.dtype),
            torch.randn(state.shape, generator=g, device="cuda"))


def _grads_of(fn, inputs, weights):
    out, final = fn(**inputs, chunk_size=64, dt_softplus=True, return_final_states=True)
    ((out.float() * weights[0].float()).sum() + (final * weights[1]).sum()).backward()
    return {k: inputs[k].grad.clone() for k in GRAD_LEAVES}


def test_gradients_match_fp64_autograd_and_triton():
    inputs = _grad_inputs(seed=7)
    weights = _loss_weights(inputs, 7)
    got = _grads_of(_adapters().mamba_chunk_scan_combined, inputs, weights)
    plain = {k: v.detach() for k, v in inputs.items()}
    ref = reference.ssd_reference_grads(weights[0].cpu(), *(plain[k].cpu() for k in ("x", "dt", "A", "B", "C")),
                                        dfinal_states=weights[1].cpu(), chunked=True, chunk_size=64, dt_softplus=True,
                                        **{k: plain[k].cpu() for k in GRAD_LEAVES[5:]})
    for k in GRAD_LEAVES:
        assert got[k].dtype == inputs[k].dtype
        reference.assert_close_scaled(got[k].float().cpu(), ref["d" + k], TOL["grads"], "d" + k)
    triton = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")
    other = _grad_inputs(seed=7)
    theirs = _grads_of(triton.mamba_chunk_scan_combined, other, weights)
    for k in GRAD_LEAVES:
        reference.assert_close_scaled(got[k].float().cpu(), theirs[k].float().cpu(), TOL["grads"], f"d{k} vs Triton")


def test_gradients_are_bitwise_reproducible_and_compile_to_the_eager_result():
    weights = _loss_weights(_grad_inputs(seed=8), 8)
    eager = _grads_of(_adapters().mamba_chunk_scan_combined, _grad_inputs(seed=8), weights)
    again = _grads_of(_adapters().mamba_chunk_scan_combined, _grad_inputs(seed=8), weights)
    compiled = _grads_of(torch.compile(_adapters().mamba_chunk_scan_combined, fullgraph=True), _grad_inputs(seed=8),
                         weights)
    for k in GRAD_LEAVES:
        assert torch.equal(eager[k], again[k]), k
        assert torch.equal(eager[k], compiled[k]), k


def _mamba2_block(params, u, ssd):
    """in_proj -> causal depthwise conv (torch; K 4) + SiLU -> SSD -> gated RMSNorm -> out_proj (state-spaces/mamba's
    Mamba2 layer without its fused kernels); ``ssd(x, dt, A, B, C, D, dt_bias)`` is the SSD under test."""
    d_inner, H, P, N, G = params["dims"]
    zxbcdt = u @ params["in_proj"]
    z, xBC, dt = torch.split(zxbcdt, [d_inner, d_inner + 2 * G * N, H], dim=-1)
    xBC = torch.nn.functional.conv1d(xBC.transpose(1, 2), params["conv"], params["conv_bias"], padding=3,
                                     groups=xBC.shape[-1])[..., :u.shape[1]].transpose(1, 2)
    x, B, C = torch.split(torch.nn.functional.silu(xBC), [d_inner, G * N, G * N], dim=-1)
    batch, L = u.shape[:2]
    y = ssd(x.reshape(batch, L, H, P), dt, -torch.exp(params["A_log"]), B.reshape(batch, L, G, N),
            C.reshape(batch, L, G, N), params["D"], params["dt_bias"]).reshape(batch, L, d_inner)
    y = y * torch.nn.functional.silu(z)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * params["norm"]
    return y @ params["out_proj"]


def test_mamba2_block_trains_like_the_oracle_path():
    """A Mamba-2 layer at the 2.7B dimensions (d_model 2560, d_inner 5120, H 80, P 64, N 128, G 1), random
    weights, batch 1, L 128: three SGD steps with the SSD of mamba2_aot (bf16 I/O) and with the fp64 oracle on the
    same rounded inputs give the same losses and in_proj gradients (bf16 tolerance)."""
    d_model, d_inner, H, P, N, G = 2560, 5120, 80, 64, 128, 1
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *shape, scale=1.0: (scale * torch.randn(*shape, generator=g, device="cuda"))  # noqa: E731
    init = {"in_proj": r(d_model, 2 * d_inner + 2 * G * N + H, scale=d_model ** -0.5),
            "conv": r(d_inner + 2 * G * N, 1, 4, scale=0.5), "conv_bias": r(d_inner + 2 * G * N, scale=0.1),
            "A_log": torch.log(torch.linspace(1, 16, H, device="cuda")), "D": torch.ones(H, device="cuda"),
            "dt_bias": torch.log(torch.expm1(torch.linspace(1e-3, 1e-1, H, device="cuda"))),
            "norm": torch.ones(d_inner, device="cuda"), "out_proj": r(d_inner, d_model, scale=d_inner ** -0.5)}
    u = r(1, 128, d_model)

    def ours(x, dt, A, B, C, D, dt_bias):
        bf = torch.bfloat16
        return _adapters().mamba_chunk_scan_combined(x.to(bf), dt.to(bf), A, B.to(bf), C.to(bf), chunk_size=64, D=D,
                                                     dt_bias=dt_bias, dt_softplus=True).float()

    def oracle(x, dt, A, B, C, D, dt_bias):
        bf = torch.bfloat16
        return reference.ssd_reference(x.to(bf), dt.to(bf), A, B.to(bf), C.to(bf), D=D, dt_bias=dt_bias,
                                       dt_softplus=True)["out"].float().to(x.device)

    runs = {}
    for name, ssd in (("ours", ours), ("oracle", oracle)):
        params = {k: v.clone().requires_grad_() for k, v in init.items()}
        params["dims"] = (d_inner, H, P, N, G)
        losses, first_grad = [], None
        for step in range(3):
            loss = _mamba2_block(params, u, ssd).pow(2).mean()
            loss.backward()
            losses.append(loss.item())
            with torch.no_grad():
                if first_grad is None:
                    first_grad = params["in_proj"].grad.clone()
                for k, v in params.items():
                    if k != "dims":
                        v -= 0.5 * v.grad
                        v.grad = None
        runs[name] = (losses, first_grad)
    (ours_losses, ours_grad), (ref_losses, ref_grad) = runs["ours"], runs["oracle"]
    assert ours_losses[-1] < ours_losses[0]  # it trains
    for a, b in zip(ours_losses, ref_losses):
        assert abs(a - b) <= 1e-2 * abs(b), (ours_losses, ref_losses)
    reference.assert_close_scaled(ours_grad.cpu(), ref_grad.cpu(), TOL["grads"], "in_proj grad")


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
