"""Deterministic input generators for SSD / verify tests (BRIEF §2 names and shapes).

Every generator returns a dict keyed by the standard argument names, so ``ssd_reference(**inputs)``
works. Activations (x, z, B, C) and raw dt are rounded to the requested I/O ``dtype`` (bf16 / fp16 /
fp32); parameters A, D, dt_bias and initial states are fp32, as in a Mamba-2 layer. All tensors are
on the CPU; the same seed gives the same values on every machine (``torch.Generator``).
"""
from __future__ import annotations

import math

import torch


def _uniform(gen, shape, lo, hi):
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))      # log(exp(y) - 1), stable for small y


def standard_inputs(B, L, H, P, N, G=1, dtype=torch.bfloat16, seed=0, *, D="H", z=False,
                    initial_states=False):
    """Realistic Mamba-2 inputs.

    A = -exp(U(log 1, log 16)) (H) fp32; dt_bias = inverse-softplus of U(1e-3, 1e-1) (H) fp32; raw dt
    ~ N(0, 0.5²) (B, L, H), so Δ = softplus(dt + dt_bias) mostly lies in ~[3e-4, 0.3]; x, B, C, z
    ~ N(0, 1). D: "H" -> (H), "HP" -> (H, P), None -> absent (D ~ N(0,1), fp32). z: include z.
    initial_states: include (B, H, P, N) fp32 ~ N(0, 1). ``dt_softplus`` is True.
    """
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(shape, generator=gen, dtype=torch.float32)  # noqa: E731
    out = {
        "x": randn(B, L, H, P).to(dtype),
        "dt": (0.5 * randn(B, L, H)).to(dtype),
        "A": (-torch.exp(_uniform(gen, (H,), 0.0, math.log(16.0)))).to(torch.float32),
        "B": randn(B, L, G, N).to(dtype),
        "C": randn(B, L, G, N).to(dtype),
        "dt_bias": _inverse_softplus(_uniform(gen, (H,), 1e-3, 1e-1)).to(torch.float32),
        "dt_softplus": True,
    }
    if D is not None:
        out["D"] = randn(*{"H": (H,), "HP": (H, P)}[D])
    if z:
        out["z"] = randn(B, L, H, P).to(dtype)
    if initial_states:
        out["initial_states"] = randn(B, H, P, N)
    return out


ZERO_DT = -1024.0   # softplus(-1024) == 0 exactly in fp32 and fp64; exactly representable in bf16/fp16


def hot_inputs(B, L, H, P, N, G=1, dtype=torch.bfloat16, seed=0, *, zero_run_fraction=0.3, **kwargs):
    """Stress inputs: very large |A| (-exp(U(log 1e2, log 1e4))), raw dt in (20, 100) (the softplus
    identity branch, so Δ·A reaches -1e6), dt_bias = 0, and runs of exactly zero Δ (raw dt = -1024,
    run lengths 1..8, covering about ``zero_run_fraction`` of the tokens). Other keys as
    :func:`standard_inputs` (``kwargs`` pass D / z / initial_states)."""
    out = standard_inputs(B, L, H, P, N, G, dtype, seed, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    dt = _uniform(gen, (B, L, H), 20.0, 100.0)
    zero = torch.zeros(B, L, H, dtype=torch.bool)
    num_runs = max(1, int(zero_run_fraction * L / 4.5))
    for b in range(B):
        for h in range(H):
            starts = torch.randint(0, L, (num_runs,), generator=gen).tolist()
            lengths = torch.randint(1, 9, (num_runs,), generator=gen).tolist()
            for s, n in zip(starts, lengths):
                zero[b, s:s + n, h] = True
    out["dt"] = torch.where(zero, torch.full_like(dt, ZERO_DT), dt).to(dtype)
    out["A"] = (-torch.exp(_uniform(gen, (H,), math.log(1e2), math.log(1e4)))).to(torch.float32)
    out["dt_bias"] = torch.zeros(H, dtype=torch.float32)
    return out


def packed_lengths(chunk_size, seed=0, extra=3):
    """Sequence lengths {1, Q-1, Q, Q+1} plus ``extra`` random ones in [1, 2Q], shuffled so that the
    first length is not a multiple of Q (most starts then fall inside chunks)."""
    Q = chunk_size
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, Q - 1, Q, Q + 1] + torch.randint(1, 2 * Q + 1, (extra,), generator=gen).tolist()
    lengths = [lengths[i] for i in torch.randperm(len(lengths), generator=gen).tolist()]
    if lengths[0] % Q == 0:
        i = lengths.index(1)
        lengths[0], lengths[i] = lengths[i], lengths[0]
    return lengths


def seq_idx_rows(*rows):
    """seq_idx (len(rows), L) int32 for rows of sequence lengths (each row summing to L): sequence k of a row is
    numbered k, so each row's numbers start at 0 (only the changes along a row mark sequences)."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
                        for lengths in rows])


def packed_inputs(H, P, N, G=1, dtype=torch.bfloat16, seed=0, *, chunk_size, extra=3, lengths=None,
                  generator=standard_inputs, **kwargs):
    """Packed variable-length sequences along L with B == 1.

    lengths: the sequence lengths (default :func:`packed_lengths`). Returns ``generator``'s dict for
    (1, sum(lengths)) plus cu_seqlens (nseq+1) int32, seq_idx (1, L) int32 (sequence number per token)
    and initial_states (nseq, H, P, N) fp32. Pass *one* of cu_seqlens / seq_idx to a reference.
    """
    lengths = packed_lengths(chunk_size, seed, extra) if lengths is None else list(lengths)
    out = generator(1, sum(lengths), H, P, N, G, dtype, seed, **kwargs)
    gen = torch.Generator().manual_seed(seed + 2_000_003)
    out["cu_seqlens"] = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
    out["seq_idx"] = seq_idx_rows(lengths)
    out["initial_states"] = torch.randn(len(lengths), H, P, N, generator=gen, dtype=torch.float32)
    return out
