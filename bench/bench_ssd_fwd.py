"""Benchmark ssd_fwd against Triton's mamba_chunk_scan_combined (forward), side by side in one process.

    PYTHONPATH=runtime:third_party_baseline python bench/bench_ssd_fwd.py [--json results.json]

Shapes: the BRIEF §6 reference shapes (bf16, fp32 final states, D (H), dt_bias, softplus). Times are CUDA-graph
replays (median; each graph holds several calls on distinct inputs so nothing stays in L2). The roofline is
the minimum bytes a call moves (x, dt, B, C, z read once; out and the fp32 final states written once)
divided by the copy bandwidth measured in the same run. Workspace: ours is ``runtime.workspace_size`` (0);
Triton's is the peak memory its call allocates beyond the outputs (per-chunk states, C·Bᵀ blocks, Δ and
cumsums), measured with torch's allocator.
"""
from __future__ import annotations

import argparse
import json

import torch

from common import baseline_in_child, copy_bandwidth, graph_time_us, provenance

# (name, batch, L, H, P, N, G, chunk_size, z)
SHAPES = (
    ("B2 L2048 H64 P64 N64 G1 Q256", 2, 2048, 64, 64, 64, 1, 256, False),
    ("B2 L2048 H64 P64 N128 G1 Q256 +z", 2, 2048, 64, 64, 128, 1, 256, True),
    ("B8 L4096 H80 P64 N128 G1 Q256 (Mamba-2 2.7B)", 8, 4096, 80, 64, 128, 1, 256, False),
    ("B1 L8192 H128 P64 N128 G8 Q128 +z (Nemotron-H-like)", 1, 8192, 128, 64, 128, 8, 128, True),
)
L2_FLUSH_BYTES = 240e6  # distinct inputs per graph until one replay touches 4x the H200's 60 MB L2


def make_inputs(batch, L, H, P, N, G, z, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    kw = {"x": r(batch, L, H, P).bfloat16(), "dt": (0.5 * r(batch, L, H)).bfloat16(),
          "A": -torch.exp(torch.rand(H, generator=g, device="cuda") * 2.77), "B": r(batch, L, G, N).bfloat16(),
          "C": r(batch, L, G, N).bfloat16(), "D": r(H), "dt_bias": torch.rand(H, generator=g, device="cuda") - 4}
    if z:
        kw["z"] = r(batch, L, H, P).bfloat16()
    return kw


def floor_bytes(batch, L, H, P, N, G, z):
    activations = batch * L * (H * P * (3 if z else 2) + 2 * G * N + H) * 2
    return activations + batch * H * P * N * 4


def copies(batch, L, H, P, N, G, z):
    return max(2, min(16, int(L2_FLUSH_BYTES // floor_bytes(batch, L, H, P, N, G, z)) + 1))


def bench_ours(shape):
    from mamba2_aot import runtime
    _, batch, L, H, P, N, G, Q, z = shape
    n = copies(batch, L, H, P, N, G, z)
    sets = [make_inputs(batch, L, H, P, N, G, z, seed=i) for i in range(n)]
    outs = [torch.empty_like(s["x"]) for s in sets]
    finals = [torch.empty(batch, H, P, N, device="cuda") for _ in range(n)]

    def run(i):
        runtime.launch("ssd_fwd", **sets[i], out=outs[i], final_states=finals[i], chunk_size=Q, dt_softplus=True)
    workspace = runtime.workspace_size("ssd_fwd", **sets[0], out=outs[0], final_states=finals[0], chunk_size=Q,
                                       dt_softplus=True)
    return graph_time_us(run, n), workspace


def bench_triton(shape):
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    _, batch, L, H, P, N, G, Q, z = shape
    n = copies(batch, L, H, P, N, G, z)
    sets = [make_inputs(batch, L, H, P, N, G, z, seed=i) for i in range(n)]

    def run(i):
        mamba_chunk_scan_combined(**sets[i], chunk_size=Q, dt_softplus=True, return_final_states=True)
    run(0)  # compile and autotune outside the measurement
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out, final = mamba_chunk_scan_combined(**sets[0], chunk_size=Q, dt_softplus=True, return_final_states=True)
    torch.cuda.synchronize()
    workspace = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size() - \
        final.numel() * final.element_size()
    return graph_time_us(run, n), workspace


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--no-baseline", action="store_true", help="skip Triton's mamba_chunk_scan_combined")
    args = parser.parse_args()
    bw = copy_bandwidth()
    results = {"provenance": provenance(), "copy_bandwidth_GBps": bw / 1e9, "rows": []}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'shape':<52} {'triton':>8} {'ours':>8} {'speedup':>7} {'floor':>7} {'roof%':>6} {'ws ours':>8} "
          f"{'ws triton':>10}")
    from mamba2_aot.errors import VariantNotFoundError
    for shape in SHAPES:
        try:
            ours_us, ours_ws = bench_ours(shape)
        except VariantNotFoundError as exc:
            print(f"{shape[0]:<52} skipped: {exc}")
            continue
        triton_us, triton_ws = (float("nan"), float("nan")) if args.no_baseline else _triton_pair(shape)
        floor_us = floor_bytes(*shape[1:7], shape[8]) / bw * 1e6
        row = {"shape": shape[0], "triton_us": triton_us, "ours_us": ours_us, "speedup": triton_us / ours_us,
               "floor_us": floor_us, "roofline_fraction": floor_us / ours_us, "workspace_bytes": ours_ws,
               "triton_workspace_bytes": triton_ws}
        results["rows"].append(row)
        print(f"{shape[0]:<52} {triton_us:8.1f} {ours_us:8.1f} {row['speedup']:7.2f} {floor_us:7.1f} "
              f"{100 * row['roofline_fraction']:5.0f}% {ours_ws / 1e6:7.1f}M {triton_ws / 1e6:9.1f}M", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _triton_pair(shape):
    result = baseline_in_child(bench_triton, shape)
    return result if isinstance(result, tuple) else (float("nan"), float("nan"))


if __name__ == "__main__":
    main()
