"""Measure what a *correct* kernel's precision costs against the fp64 oracle (CPU only).

Run from the repository root:  PYTHONPATH=tests python -m reference.measure_tolerances [--seeds N]

Kernel precision is emulated on the CPU with the references' own machinery:

- prefill (ssd_fwd): inputs rounded to the I/O dtype by the generators; ``ssd_chunked_reference``
  in fp32 (``compute_dtype=float32``), matmul operands either exact fp32 or rounded to the I/O dtype
  (tf32 for fp32 I/O) as tensor-core kernels do (upstream Triton: ``cb.to(x.dtype)``,
  ``b.to(x.dtype)``, ``prev_states.to(C.dtype)``); ``out`` rounded to the I/O dtype; states fp32.
  Oracle: ``ssd_reference`` (fp64, token by token) on the same rounded inputs.
- decode (verify): 64 single-token ``verify_update`` calls per request with fp32 math
  (``compute_dtype=float32``) on a pool of dtype fp32 (I/O fp32 / bf16 / fp16) or bf16 / fp16 (same
  I/O dtype), starting from a prefill state; outputs rounded to the I/O dtype. Oracle: the same calls
  in fp64 with the same ``pool_dtype`` (the oracle mirrors the kernel's pool rounding).
- backward (ssd_bwd): fp32 autograd through the fp32 chunked emulation (operands rounded to the I/O
  dtype, which also rounds the gradients flowing through them); gradients of I/O-dtype inputs rounded
  to the I/O dtype. Oracle: fp64 autograd (``ssd_reference_grads``, chunked form: equal to the
  token-by-token one to 1e-11, tests/test_oracle.py).

Error = max|emulated - oracle| / rms(oracle) per tensor, worst over seeds, shapes and generators.
Prints markdown tables (pasted into docs/TOLERANCES.md).
"""
from __future__ import annotations

import argparse
import itertools
import time

import torch

from ._common import TF32
from .compare import scaled_error
from .generators import hot_inputs, packed_inputs, standard_inputs
from .ssd import ssd_chunked_reference, ssd_reference, ssd_reference_grads
from .verify import verify_update

F32 = torch.float32
IO_DTYPES = {"fp32": F32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (B, L, H, P, N, G, Q): realistic head/state sizes, a few heads (errors are per head statistics).
PREFILL_SHAPES = [(2, 512, 4, 64, 64, 1, 64), (1, 1024, 4, 64, 128, 2, 128), (1, 1024, 2, 64, 128, 1, 256)]
GRAD_SHAPES = [(1, 256, 2, 64, 64, 1, 64), (1, 256, 2, 64, 128, 2, 128)]


def prefill_inputs(kind, shape, dtype, seed):
    B, L, H, P, N, G, Q = shape
    options = dict(D="H", z=True)
    if kind == "standard":
        return standard_inputs(B, L, H, P, N, G, dtype, seed, initial_states=True, **options)
    if kind == "hot":
        return hot_inputs(B, L, H, P, N, G, dtype, seed, **options)
    inp = packed_inputs(H, P, N, G, dtype, seed, chunk_size=Q, extra=L // Q, **options)
    inp.pop("seq_idx")
    return inp


def measure_prefill(seeds, worst):
    for (io, dtype), kind, shape, seed in itertools.product(IO_DTYPES.items(), ("standard", "hot", "packed"),
                                                           PREFILL_SHAPES, range(seeds)):
        inp = prefill_inputs(kind, shape, dtype, seed)
        Q = shape[-1]
        oracle = ssd_reference(**inp, chunk_size=Q, return_final_states=True, return_chunk_states=True)
        for operands in (None, TF32 if io == "fp32" else dtype):
            emu = ssd_chunked_reference(**inp, chunk_size=Q, return_final_states=True, return_chunk_states=True,
                                        compute_dtype=F32, operand_dtype=operands)
            case = (io, "fp32 operands" if operands is None else f"{'tf32' if io == 'fp32' else io} operands")
            record(worst, case, "out", kind, scaled_error(emu["out"].to(dtype), oracle["out"]), (shape, seed))
            for key in ("final_states", "chunk_states"):
                record(worst, case, key, kind, scaled_error(emu[key], oracle[key]), (shape, seed))


DECODE_CASES = [("fp32", "fp32"), ("bf16", "fp32"), ("fp16", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")]


def measure_decode(seeds, worst):
    H, P, N, G, Bt, tokens = 4, 64, 128, 1, 4, 64
    for (io, pool_name), seed in itertools.product(DECODE_CASES, range(seeds)):
        io_dtype, pool_dtype = IO_DTYPES[io], IO_DTYPES[pool_name]
        start = ssd_reference(**standard_inputs(Bt, 256, H, P, N, G, io_dtype, seed + 500), return_final_states=True)
        inp = standard_inputs(Bt, tokens, H, P, N, G, io_dtype, seed, D="H", z=True)
        slots = torch.arange(Bt)
        pools = {"oracle": start["final_states"].to(pool_dtype), "emu": start["final_states"].to(pool_dtype)}
        outs = {"oracle": [], "emu": []}
        for t in range(tokens):          # T single-token calls == one T-token call (bitwise; tested)
            rows = {k: (v[:, t:t + 1] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()}
            for who, compute in (("oracle", torch.float64), ("emu", F32)):
                res = verify_update(pools[who], slots, **rows, pool_dtype=pool_dtype, compute_dtype=compute)
                pools[who] = res.pool
                outs[who].append(res.out)
        out_err = scaled_error(torch.cat(outs["emu"], 1).to(io_dtype), torch.cat(outs["oracle"], 1))
        case = (io, f"pool {pool_name}")
        record(worst, case, "out", "decode", out_err, seed)
        record(worst, case, "pool", "decode", scaled_error(pools["emu"], pools["oracle"]), seed)


def measure_grads(seeds, worst):
    for (io, dtype), kind, shape, seed in itertools.product(
            [(k, v) for k, v in IO_DTYPES.items()], ("standard", "packed"), GRAD_SHAPES, range(seeds)):
        inp = prefill_inputs(kind, shape, dtype, seed)
        Q = shape[-1]
        gen = torch.Generator().manual_seed(seed + 77)
        dout = torch.randn(inp["x"].shape, generator=gen).to(dtype)
        oracle = ssd_reference_grads(dout, **inp, chunked=True, chunk_size=Q)
        leaves = {k: v.to(F32).requires_grad_(True) for k, v in inp.items()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()}
        emu = ssd_chunked_reference(**{**inp, **leaves}, chunk_size=Q, compute_dtype=F32,
                                    operand_dtype=None if io == "fp32" else dtype)
        grads = torch.autograd.grad(emu["out"].to(dtype).to(F32), list(leaves.values()), dout.to(F32))
        for name, g in zip(leaves, grads):
            if inp[name].dtype == dtype:
                g = g.to(dtype)                  # dx, ddt, dB, dC, dz are returned in the I/O dtype
            record(worst, (io, "grads"), "d" + name, kind, scaled_error(g, oracle["d" + name]), (shape, seed))


def record(worst, case, quantity, kind, err, where):
    """Keep the worst error per (case, quantity, generator kind) and where it happened."""
    key = (case, quantity)
    if err > worst.setdefault(key, {}).get(kind, (-1.0, None))[0]:
        worst[key][kind] = (err, where)


PARTS = {"prefill": ("prefill (ssd_fwd)", measure_prefill),
         "decode": ("decode (verify_update, 64 single-token calls)", measure_decode),
         "backward": ("backward (ssd_bwd)", measure_grads)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    args = parser.parse_args()
    for title, fn in ((PARTS[p][0], PARTS[p][1]) for p in args.parts):
        t0 = time.time()
        worst = {}
        fn(args.seeds, worst)
        kinds = sorted({kind for per_kind in worst.values() for kind in per_kind})
        print(f"\n### {title}: worst scaled error over {args.seeds} seeds ({time.time() - t0:.0f} s)\n")
        print("| case | variant | quantity | " + " | ".join(kinds) + " | worst at (shape, seed) |")
        print("|---|---|---|" + "---|" * (len(kinds) + 1))
        for ((case, variant), quantity), per_kind in sorted(worst.items()):
            top = max(per_kind.values(), key=lambda e: e[0])
            cells = " | ".join(f"{per_kind[k][0]:.2e}" if k in per_kind else "" for k in kinds)
            print(f"| {case} | {variant} | {quantity} | {cells} | {top[1]} |")


if __name__ == "__main__":
    main()
