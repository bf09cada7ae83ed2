"""ssd_fwd against Triton's mamba_chunk_scan_combined (forward), side by side in one process.

Measured by ``bench/run.py`` (which also runs this module's scaling sweep); alone::

    PYTHONPATH=runtime:third_party_baseline python bench/bench_ssd_fwd.py

Shapes: the BRIEF §6 reference shapes (bf16, fp32 final states, D (H), dt_bias, softplus). Times are CUDA-graph
replays (median; each graph holds several calls on distinct inputs so nothing stays in L2), the same with a cuBLAS
GEMM before each call (its time subtracted: a call as in a model, after another kernel) and eager wall time per call.
The roofline is the minimum bytes a call moves (x, dt, B, C, z read once; out and the fp32 final
states written once) divided by the copy bandwidth measured in the same run. Workspace: ours is
``runtime.workspace_size`` (the entering states of a call split along L; 0 when not split); Triton's is the peak
memory its call allocates beyond its outputs (per-chunk states, C·Bᵀ blocks, Δ and cumsums), measured with torch's
allocator.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from common import (copy_bandwidth, eager_time_us, graph_time_after_gemm_us, graph_time_us, rotation, side_by_side,
                    with_baseline)



class Shape(NamedTuple):
    name: str
    batch: int
    L: int
    H: int
    P: int
    N: int
    G: int
    Q: int
    z: bool


REFERENCE_SHAPES = (
    Shape("B2 L2048 H64 P64 N64 G1 Q256", 2, 2048, 64, 64, 64, 1, 256, False),
    Shape("B2 L2048 H64 P64 N128 G1 Q256 +z", 2, 2048, 64, 64, 128, 1, 256, True),
    Shape("B8 L4096 H80 P64 N128 G1 Q256 (Mamba-2 2.7B)", 8, 4096, 80, 64, 128, 1, 256, False),
    Shape("B1 L8192 H128 P64 N128 G8 Q128 +z (Nemotron-H-like)", 1, 8192, 128, 64, 128, 8, 128, True),
)


def scaling_shapes():
    """How cost grows with the work: L from 512 to 65536 at batch 1, and batch 1 to 64 at L 2048 (H64 P64 N128
    G1 Q256, the shapes of the first reference rows)."""
    by_L = [Shape(f"B1 L{L}", 1, L, 64, 64, 128, 1, 256, False) for L in (512, 2048, 8192, 32768, 65536)]
    by_batch = [Shape(f"B{b} L2048", b, 2048, 64, 64, 128, 1, 256, False) for b in (1, 4, 16, 64)]
    return by_L, by_batch


def make_inputs(s: Shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, device="cuda")  # noqa: E731
    kw = {"x": r(s.batch, s.L, s.H, s.P).bfloat16(), "dt": (0.5 * r(s.batch, s.L, s.H)).bfloat16(),
          "A": -torch.exp(torch.rand(s.H, generator=g, device="cuda") * 2.77),
          "B": r(s.batch, s.L, s.G, s.N).bfloat16(), "C": r(s.batch, s.L, s.G, s.N).bfloat16(), "D": r(s.H),
          "dt_bias": torch.rand(s.H, generator=g, device="cuda") - 4}
    if s.z:
        kw["z"] = r(s.batch, s.L, s.H, s.P).bfloat16()
    return kw


def floor_bytes(s: Shape) -> int:
    activations = s.batch * s.L * (s.H * s.P * (3 if s.z else 2) + 2 * s.G * s.N + s.H) * 2
    return activations + s.batch * s.H * s.P * s.N * 4


def _times(run, n: int, after_gemm: bool) -> dict:
    """Graph and eager times of ``run`` over ``n`` input sets, and after a GEMM when asked."""
    times = {"us": graph_time_us(run, n), "eager_us": eager_time_us(run, n)}
    if after_gemm:
        times["after_gemm_us"] = graph_time_after_gemm_us(run, n)
    return times


def our_forward(s: Shape):
    """Our forward on rotated input sets: (run(i), the number of sets, set i's outputs by name, the workspace
    bytes)."""
    from mamba2_aot import runtime
    n = rotation(floor_bytes(s), most=16)
    sets = [make_inputs(s, seed=i) for i in range(n)]
    outs = [torch.empty_like(x["x"]) for x in sets]
    finals = [torch.empty(s.batch, s.H, s.P, s.N, device="cuda") for _ in range(n)]
    workspace = runtime.workspace_size("ssd_fwd", x=sets[0]["x"], B=sets[0]["B"])
    spaces = [torch.empty(workspace // 4, device="cuda") if workspace else None for _ in range(n)]

    def run(i):
        runtime.launch("ssd_fwd", **sets[i], out=outs[i], final_states=finals[i], chunk_size=s.Q, dt_softplus=True,
                       workspace=spaces[i])
    return run, n, lambda i: {"out": outs[i], "final_states": finals[i]}, workspace


def bench_ours(s: Shape, after_gemm: bool = False) -> dict:
    run, n, _, workspace = our_forward(s)
    return {**_times(run, n, after_gemm), "workspace_bytes": workspace}


def bench_triton(s: Shape, after_gemm: bool = False) -> dict:
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    n = rotation(floor_bytes(s), most=16)
    sets = [make_inputs(s, seed=i) for i in range(n)]

    def run(i):
        return mamba_chunk_scan_combined(**sets[i], chunk_size=s.Q, dt_softplus=True, return_final_states=True)
    run(0)  # compile and autotune outside the measurement
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out, final = run(0)
    torch.cuda.synchronize()
    workspace = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size() - \
        final.numel() * final.element_size()
    del out, final
    return {**_times(run, n, after_gemm), "workspace_bytes": workspace}


def measure(s: Shape, bandwidth: float, baseline: bool) -> dict:
    """One row: ours and (when asked, side by side in one fresh process) Triton's graph and eager times,
    workspace, roofline; with the baseline, both also after a GEMM (the comparison that figure is for)."""
    ours, triton = side_by_side(bench_ours, bench_triton if baseline else None, s, baseline)
    row = {"shape": s.name, **s._asdict(), "floor_us": floor_bytes(s) / bandwidth * 1e6, "ours": ours}
    row["roofline_fraction"] = row["floor_us"] / row["ours"]["us"]
    return with_baseline(row, triton) if baseline else row


def main():
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    for s in REFERENCE_SHAPES:
        r = measure(s, bw, baseline=True)
        t = r.get("triton") or {"us": float("nan"), "after_gemm_us": float("nan")}
        print(f"{s.name:<52} triton {t['us']:8.1f}  ours {r['ours']['us']:8.1f}  "
              f"roofline {100 * r['roofline_fraction']:4.0f}%  after a GEMM: triton {t['after_gemm_us']:8.1f}  "
              f"ours {r['ours']['after_gemm_us']:8.1f}", flush=True)


if __name__ == "__main__":
    main()
