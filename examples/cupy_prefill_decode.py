"""mamba2_aot from CuPy: prefill with ``ssd_fwd``, then decode one token with ``verify``, on CuPy arrays.

CuPy hands its arrays to the runtime through ``__cuda_array_interface__`` (zero-copy; the runtime reads pointer,
shape, strides and dtype from it). That interface has no bfloat16 type, so this example runs fp16 I/O (the full
build has fp16 variants of both families; bf16 CuPy arrays would have to go through DLPack). Outputs are
caller-owned CuPy arrays written in place; kernels run on the stream passed (CuPy's current one).

The check at the end needs no oracle: decoding token L from the state the prefill of tokens 0..L-1 left in the
pool gives the same output as one ``ssd_fwd`` over all L + 1 tokens (chunked vs recurrent form, fp16 rounding).

    pip install cupy-cuda12x dist/mamba2_aot-*.whl dist/mamba2_aot_cubins_sm90-*.whl
    python examples/cupy_prefill_decode.py
"""
import cupy as cp

from mamba2_aot import runtime


def main(batch=2, L=200, nheads=8, headdim=64, d_state=128, ngroups=1, seed=0):
    rs = cp.random.RandomState(seed)

    def normal(*shape, scale=1.0):
        return rs.standard_normal(shape, dtype=cp.float32) * scale

    T = L + 1
    x = normal(batch, T, nheads, headdim).astype(cp.float16)
    dt = normal(batch, T, nheads, scale=0.5).astype(cp.float16)           # raw dt: dt_bias and softplus follow
    A = -cp.exp(normal(nheads, scale=0.5))                                 # fp32, negative
    B = normal(batch, T, ngroups, d_state, scale=d_state ** -0.5).astype(cp.float16)
    C = normal(batch, T, ngroups, d_state, scale=d_state ** -0.5).astype(cp.float16)
    D = normal(nheads)
    dt_bias = normal(nheads, scale=0.5) - 1.0
    options = dict(A=A, D=D, dt_bias=dt_bias, dt_softplus=True)
    stream = cp.cuda.get_current_stream()

    # the reference: one pass over all L + 1 tokens
    full = cp.empty_like(x)
    runtime.launch("ssd_fwd", x=x, dt=dt, B=B, C=C, out=full, chunk_size=256, stream=stream, **options)

    # prefill tokens 0..L-1 (column views of the same arrays), each sequence's final state into its pool slot
    pool = cp.zeros((batch, nheads, headdim, d_state), dtype=cp.float32)
    slots = cp.arange(batch, dtype=cp.int32)
    prefill = cp.empty((batch, L, nheads, headdim), dtype=cp.float16)
    runtime.launch("ssd_fwd", x=x[:, :L], dt=dt[:, :L], B=B[:, :L], C=C[:, :L], out=prefill, chunk_size=256,
                   final_states=pool, final_state_indices=slots, stream=stream, **options)

    # decode token L from the pool; the pool's slots are updated in place
    step = cp.empty((batch, 1, nheads, headdim), dtype=cp.float16)
    runtime.launch("verify", mode="update", state=pool, x=x[:, L:], dt=dt[:, L:], B=B[:, L:], C=C[:, L:], out=step,
                   state_indices=slots, stream=stream, **options)
    stream.synchronize()

    got, want = step[:, 0].astype(cp.float32), full[:, L].astype(cp.float32)
    error = float(cp.abs(got - want).max()) / float(cp.abs(want).max())
    prefix = float(cp.abs(prefill.astype(cp.float32) - full[:, :L].astype(cp.float32)).max()) / float(cp.abs(want).max())
    print(f"decode vs one pass: max error {error:.2e} of the output's scale; prefill vs one pass: {prefix:.2e}")
    assert error < 2e-2 and prefix < 1e-2, "the decode step disagrees with the one-pass forward"
    return error


if __name__ == "__main__":
    main()
