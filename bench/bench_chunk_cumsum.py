"""ssd_chunk_cumsum against Triton's ``_chunk_cumsum_fwd`` (the first stage of its SSD forward), side by side.

Measured by ``bench/run.py`` at the (batch, L, H, chunk_size) of the BRIEF's reference shapes: bf16 dt, dt_bias,
softplus; outputs Δ and the per-chunk cumsum of Δ·A, fp32, (batch, H, nchunks, Q). Roofline: dt read once,
both outputs written once.
"""
from __future__ import annotations

import torch

from bench_ssd_fwd import REFERENCE_SHAPES
from common import eager_time_us, graph_time_us, rotation, side_by_side


def _inputs(batch, L, H, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {"dt": (0.5 * torch.randn(batch, L, H, generator=g, device="cuda")).bfloat16(),
            "A": -torch.exp(torch.rand(H, generator=g, device="cuda") * 2.77),
            "dt_bias": torch.rand(H, generator=g, device="cuda") - 4}


def floor_bytes(batch, L, H, Q) -> int:
    return batch * L * H * 2 + 2 * batch * H * (-(-L // Q)) * Q * 4


def bench_ours(batch, L, H, Q) -> dict:
    from mamba2_aot import runtime
    n = rotation(floor_bytes(batch, L, H, Q))
    sets = [_inputs(batch, L, H, i) for i in range(n)]
    nchunks = -(-L // Q)
    outs = [(torch.empty(batch, H, nchunks, Q, device="cuda"), torch.empty(batch, H, nchunks, Q, device="cuda"))
            for _ in range(n)]

    def run(i):
        runtime.launch("ssd_chunk_cumsum", **sets[i], dt_out=outs[i][0], dA_cumsum=outs[i][1], chunk_size=Q,
                       dt_softplus=True)
    return {"us": graph_time_us(run, n), "eager_us": eager_time_us(run, n), "workspace_bytes": 0}


def bench_triton(batch, L, H, Q) -> dict:
    from mamba_ssm.ops.triton.ssd_chunk_state import _chunk_cumsum_fwd
    n = rotation(floor_bytes(batch, L, H, Q))
    sets = [_inputs(batch, L, H, i) for i in range(n)]

    def run(i):
        return _chunk_cumsum_fwd(sets[i]["dt"], sets[i]["A"], Q, dt_bias=sets[i]["dt_bias"], dt_softplus=True)
    run(0)
    return {"us": graph_time_us(run, n), "eager_us": eager_time_us(run, n)}


def measure(bandwidth: float, baseline: bool) -> list[dict]:
    rows = []
    for s in {(s.batch, s.L, s.H, s.Q): s for s in REFERENCE_SHAPES}.values():  # (two share these dims)
        ours, triton = side_by_side(bench_ours, bench_triton if baseline else None, s.batch, s.L, s.H, s.Q)
        row = {"shape": f"B{s.batch} L{s.L} H{s.H} Q{s.Q}", "batch": s.batch, "L": s.L, "H": s.H, "Q": s.Q,
               "floor_us": floor_bytes(s.batch, s.L, s.H, s.Q) / bandwidth * 1e6, "ours": ours}
        row["roofline_fraction"] = row["floor_us"] / row["ours"]["us"]
        if baseline:
            row["triton"] = triton
        rows.append(row)
    return rows
