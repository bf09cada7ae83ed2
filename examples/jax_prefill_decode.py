"""mamba2_aot from JAX (eager): prefill with ``ssd_fwd``, then decode one token with ``verify``, on JAX inputs.

JAX arrays offer both array protocols. The runtime reads an fp16 / fp32 one through ``__cuda_array_interface__``
(which it prefers when both are there) and a bf16 one through DLPack (``__dlpack__``, parsed with ctypes; the
interface has no bf16). JAX arrays are immutable and JAX exports them read-only, so the runtime refuses one as
an output or a state pool (and launches nothing). The outputs and the pool therefore live in memory that a
mutable-array library owns, here CuPy (whose arrays have no bfloat16, so this example runs fp16); the kernels
run on CuPy's stream, and JAX reads the results zero-copy through DLPack. The inputs are made ready
(``jax.block_until_ready``) and kept referenced until the kernels are done: the runtime only reads their
addresses. Use this from eager code, not inside ``jax.jit``.

The check at the end needs no oracle: decoding token L from the state the prefill of tokens 0..L-1 left in the
pool gives the same output as one ``ssd_fwd`` over all L + 1 tokens (chunked vs recurrent form, fp16 rounding).

    pip install "jax[cuda12]" cupy-cuda12x dist/mamba2_aot-*.whl dist/mamba2_aot_cubins_sm90-*.whl
    python examples/jax_prefill_decode.py
"""
import cupy as cp
import jax
import jax.numpy as jnp

from mamba2_aot import runtime


def main(batch=2, L=200, nheads=8, headdim=64, d_state=128, ngroups=1, seed=0):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 8))

    def normal(*shape, scale=1.0):
        return jax.random.normal(next(keys), shape, jnp.float32) * scale

    T = L + 1
    x = normal(batch, T, nheads, headdim).astype(jnp.float16)
    dt = normal(batch, T, nheads, scale=0.5).astype(jnp.float16)           # raw dt: dt_bias and softplus follow
    A = -jnp.exp(normal(nheads, scale=0.5))                                 # fp32, negative
    B = normal(batch, T, ngroups, d_state, scale=d_state ** -0.5).astype(jnp.float16)
    C = normal(batch, T, ngroups, d_state, scale=d_state ** -0.5).astype(jnp.float16)
    D = normal(nheads)
    dt_bias = normal(nheads, scale=0.5) - 1.0
    head = (x[:, :L], dt[:, :L], B[:, :L], C[:, :L])    # tokens 0..L-1 (new arrays: kept until the end)
    tail = (x[:, L:], dt[:, L:], B[:, L:], C[:, L:])    # token L
    jax.block_until_ready((x, dt, A, B, C, D, dt_bias, head, tail))
    options = dict(A=A, D=D, dt_bias=dt_bias, dt_softplus=True)
    stream = cp.cuda.get_current_stream()

    # the reference: one pass over all L + 1 tokens
    full = cp.empty((batch, T, nheads, headdim), dtype=cp.float16)
    runtime.launch("ssd_fwd", x=x, dt=dt, B=B, C=C, out=full, chunk_size=256, stream=stream, **options)

    # prefill tokens 0..L-1, each sequence's final state into its slot of a state pool
    pool = cp.zeros((batch, nheads, headdim, d_state), dtype=cp.float32)
    slots = cp.arange(batch, dtype=cp.int32)
    prefill = cp.empty((batch, L, nheads, headdim), dtype=cp.float16)
    runtime.launch("ssd_fwd", x=head[0], dt=head[1], B=head[2], C=head[3], out=prefill, chunk_size=256,
                   final_states=pool, final_state_indices=slots, stream=stream, **options)

    # decode token L from the pool; the pool's slots are updated in place
    step = cp.empty((batch, 1, nheads, headdim), dtype=cp.float16)
    runtime.launch("verify", mode="update", state=pool, x=tail[0], dt=tail[1], B=tail[2], C=tail[3], out=step,
                   state_indices=slots, stream=stream, **options)
    stream.synchronize()

    # back in JAX, zero-copy
    full, prefill, step = (jax.dlpack.from_dlpack(a).astype(jnp.float32) for a in (full, prefill, step))
    want = full[:, L]
    scale = float(jnp.abs(want).max())
    error = float(jnp.abs(step[:, 0] - want).max()) / scale
    prefix = float(jnp.abs(prefill - full[:, :L]).max()) / scale
    print(f"decode vs one pass: max error {error:.2e} of the output's scale; prefill vs one pass: {prefix:.2e}")
    assert error < 2e-2 and prefix < 1e-2, "the decode step disagrees with the one-pass forward"
    return error


if __name__ == "__main__":
    main()
