"""ssd_fwd + ssd_bwd against Triton's mamba_chunk_scan_combined forward + backward, side by side in one process.

Measured by ``bench/run.py`` (section ``ssd_bwd``); alone::

    PYTHONPATH=runtime:third_party_baseline python bench/bench_ssd_bwd.py [SHAPE_POSITION ...]

Shapes: the BRIEF §6 reference shapes (positions 0-3; bf16, D (H), dt_bias, softplus; no state gradients), and on
request the shapes after them (``OTHER_SHAPES``: the second reference row's shape at N 256, position 4). A training step
runs the forward, then the backward from dout: ours is ``launch("ssd_fwd")`` then ``launch("ssd_bwd")`` (which
recomputes what it needs); Triton's is ``_mamba_chunk_scan_combined_fwd`` then ``_mamba_chunk_scan_combined_bwd``
on what its autograd function saves (the calls ``mamba_chunk_scan_combined``'s backward makes). Times are
CUDA-graph replays (median; each graph holds several steps on distinct inputs). The backward's floor: its
minimum bytes (x, dt, B, C, z, dout read once; dx, ddt, dB, dC, dz written once) over the copy bandwidth of the
same run. Workspace: ours is ``runtime.workspace_size("ssd_bwd", ...)``; Triton's backward is not measured
(it allocates its per-chunk states, their gradients and C·Bᵀ blocks inside the call).
"""
from __future__ import annotations

import sys

import torch

from bench_ssd_fwd import REFERENCE_SHAPES, Shape, make_inputs
from common import copy_bandwidth, graph_time_us, rotation, side_by_side, with_baseline


# run on request only (not in bench/run.py's report): the second reference row at d_state 256
OTHER_SHAPES = (Shape("B2 L2048 H64 P64 N256 G1 Q256 +z", 2, 2048, 64, 64, 256, 1, 256, True),)


def backward_floor_bytes(s: Shape) -> int:
    per_token = s.H * s.P * (5 if s.z else 3) + 4 * s.G * s.N + 2 * s.H   # x, dout, dx (+ z, dz); B, C, dB, dC; dt, ddt
    return s.batch * s.L * per_token * 2


def _grads(x):
    return {"dx": torch.empty_like(x["x"]), "ddt": torch.empty_like(x["dt"]), "dA": torch.empty_like(x["A"]),
            "dB": torch.empty_like(x["B"]), "dC": torch.empty_like(x["C"]), "dD": torch.empty_like(x["D"]),
            "ddt_bias": torch.empty_like(x["dt_bias"]), **({"dz": torch.empty_like(x["z"])} if "z" in x else {})}


def our_training_step(s: Shape):
    """Our training step on rotated input sets: (forward(i), backward(i) (after set i's forward), the number of sets,
    set i's gradients by name, the workspace bytes)."""
    from mamba2_aot import runtime
    n = rotation(3 * backward_floor_bytes(s), most=8)
    sets = [make_inputs(s, seed=i) for i in range(n)]
    outs = [torch.empty_like(x["x"]) for x in sets]
    douts = [torch.randn_like(x["x"]) for x in sets]
    grads = [_grads(x) for x in sets]
    size = runtime.workspace_size("ssd_bwd", x=sets[0]["x"], B=sets[0]["B"])
    workspace = torch.empty(size // 4, device="cuda")  # one: the steps of a graph run in order
    assert size >= runtime.workspace_size("ssd_fwd", x=sets[0]["x"], B=sets[0]["B"])  # the forward's too

    def forward(i):
        runtime.launch("ssd_fwd", **sets[i], out=outs[i], chunk_size=s.Q, dt_softplus=True, workspace=workspace)

    def backward(i):
        runtime.launch("ssd_bwd", **sets[i], dout=douts[i], workspace=workspace, dt_softplus=True, **grads[i])
    return forward, backward, n, grads.__getitem__, size


def bench_ours(s: Shape) -> dict:
    forward, backward, n, _, size = our_training_step(s)

    def step(i):
        forward(i)
        backward(i)
    return {"us": graph_time_us(step, n), "backward_us": graph_time_us(backward, n), "workspace_bytes": size}


def bench_triton(s: Shape) -> dict:
    from mamba_ssm.ops.triton.ssd_combined import _mamba_chunk_scan_combined_bwd, _mamba_chunk_scan_combined_fwd
    n = rotation(3 * backward_floor_bytes(s), most=8)
    sets = [make_inputs(s, seed=i) for i in range(n)]
    douts = [torch.randn_like(x["x"]) for x in sets]
    saved = {}

    def forward(i):
        out, out_x, *_ = _mamba_chunk_scan_combined_fwd(**sets[i], chunk_size=s.Q, dt_softplus=True)
        saved[i] = out if out_x is None else out_x  # what the autograd function keeps for its backward
        return out

    def backward(i):
        return _mamba_chunk_scan_combined_bwd(douts[i], **sets[i], out=saved[i], chunk_size=s.Q, dt_softplus=True)

    def step(i):
        forward(i)
        return backward(i)
    for i in range(n):  # compile and autotune outside the measurement, and keep a forward result for each set
        step(i)
    torch.cuda.synchronize()
    return {"us": graph_time_us(step, n), "backward_us": graph_time_us(backward, n)}


def measure(s: Shape, bandwidth: float, baseline: bool) -> dict:
    ours, triton = side_by_side(bench_ours, bench_triton if baseline else None, s)
    row = {"shape": s.name, **s._asdict(), "backward_floor_us": backward_floor_bytes(s) / bandwidth * 1e6,
           "ours": ours}
    row["backward_roofline_fraction"] = row["backward_floor_us"] / row["ours"]["backward_us"]
    return with_baseline(row, triton) if baseline else row


def main(argv=None):
    """Every reference shape, or those whose positions (0-3, or 4 for OTHER_SHAPES) are given on the command line."""
    picked = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    shapes = REFERENCE_SHAPES + OTHER_SHAPES
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    for s in [shapes[i] for i in picked] or REFERENCE_SHAPES:
        r = measure(s, bw, baseline=True)
        t = r.get("triton") or {"us": float("nan"), "backward_us": float("nan")}
        print(f"{s.name:<52} fwd+bwd: triton {t['us']:8.1f}  ours {r['ours']['us']:8.1f} us  | bwd: triton "
              f"{t['backward_us']:8.1f}  ours {r['ours']['backward_us']:8.1f} us ({100 * r['backward_roofline_fraction']:.0f}% "
              f"of its floor)  workspace {r['ours']['workspace_bytes'] / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
