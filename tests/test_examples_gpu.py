"""The framework examples (examples/): each runs where its libraries are installed; the two array protocols
(``__cuda_array_interface__``, which CuPy arrays and fp16 / fp32 JAX arrays take, and DLPack, which bf16 JAX
arrays take) are exercised here for the same calls with torch tensors that show only one of them, so both paths
are covered on machines without CuPy or JAX too."""
import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from built_variants import require_built  # noqa: E402
from runtime_fakes import OnlyCAI, OnlyDLPack  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHAPE = dict(batch=2, L=200, nheads=8, headdim=64, d_state=128, ngroups=1)


def _require(io):
    for family in ("ssd_fwd", "verify"):
        require_built(family, io_dtype=io)


def _run_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.main(**SHAPE)


def test_cupy_example():
    pytest.importorskip("cupy")
    _require("fp16")
    assert _run_example("cupy_prefill_decode") < 2e-2


def test_jax_example():
    jax = pytest.importorskip("jax")
    pytest.importorskip("cupy")  # the example's outputs: JAX arrays are immutable
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    _require("fp16")
    assert _run_example("jax_prefill_decode") < 2e-2


def test_a_jax_array_is_refused_as_an_output():
    """JAX exports its arrays read-only: the runtime refuses one as an output before launching."""
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    _require("fp16")
    from mamba2_aot import InvalidArgumentError, runtime
    jnp = jax.numpy
    x = jnp.ones((1, 8, 8, 64), jnp.float16)
    out = jnp.full(x.shape, 7.0, jnp.float16)
    with pytest.raises(InvalidArgumentError, match="^out: is read-only"):
        runtime.launch("ssd_fwd", x=x, dt=jnp.zeros((1, 8, 8), jnp.float16), A=-jnp.ones(8),
                       B=jnp.ones((1, 8, 1, 128), jnp.float16), C=jnp.ones((1, 8, 1, 128), jnp.float16), out=out,
                       chunk_size=64)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("wrap,io", [(OnlyCAI, "fp16"), (OnlyDLPack, "bf16")], ids=["cuda-array-interface", "dlpack"])
def test_prefill_then_decode_through_one_protocol(wrap, io):
    """The examples' calls (ssd_fwd on column views into a pool's slots, then verify from the pool) with every
    array seen only through one protocol: the decode step equals the one-pass forward's last token."""
    from mamba2_aot import runtime
    _require(io)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[io]
    batch, L, H, P, N, G = (SHAPE[k] for k in ("batch", "L", "nheads", "headdim", "d_state", "ngroups"))
    gen = torch.Generator(device="cuda").manual_seed(3)

    def normal(*shape, scale=1.0):
        return torch.randn(shape, generator=gen, device="cuda") * scale

    T = L + 1
    x, dt = normal(batch, T, H, P).to(dtype), normal(batch, T, H, scale=0.5).to(dtype)
    B, C = (normal(batch, T, G, N, scale=N ** -0.5).to(dtype) for _ in range(2))
    options = dict(A=wrap(-torch.exp(normal(H, scale=0.5))), D=wrap(normal(H)), dt_bias=wrap(normal(H) - 1.0),
                   dt_softplus=True)
    stream = torch.cuda.current_stream().cuda_stream
    full = torch.empty_like(x)
    runtime.launch("ssd_fwd", x=wrap(x), dt=wrap(dt), B=wrap(B), C=wrap(C), out=wrap(full), chunk_size=256,
                   stream=stream, **options)
    pool = torch.zeros(batch, H, P, N, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    prefill = torch.empty(batch, L, H, P, dtype=dtype, device="cuda")
    runtime.launch("ssd_fwd", x=wrap(x[:, :L]), dt=wrap(dt[:, :L]), B=wrap(B[:, :L]), C=wrap(C[:, :L]),
                   out=wrap(prefill), chunk_size=256, final_states=wrap(pool), final_state_indices=wrap(slots),
                   stream=stream, **options)
    step = torch.empty(batch, 1, H, P, dtype=dtype, device="cuda")
    runtime.launch("verify", mode="update", state=wrap(pool), x=wrap(x[:, L:]), dt=wrap(dt[:, L:]), B=wrap(B[:, L:]),
                   C=wrap(C[:, L:]), out=wrap(step), state_indices=wrap(slots), stream=stream, **options)
    torch.cuda.synchronize()
    want = full[:, L].float()
    scale = want.abs().max()
    assert torch.isfinite(full).all() and torch.isfinite(step).all()
    assert (step[:, 0].float() - want).abs().max() / scale < 2e-2
    assert (prefill.float() - full[:, :L].float()).abs().max() / scale < 1e-2
    assert scale > 0.1  # a real signal, not zeros
