"""Benchmark the verify family against Triton's selective_state_update, side by side in one process.

    PYTHONPATH=runtime:third_party_baseline python bench/bench_verify.py      # (bench/run.py records results)

Shape: H128 P64 N128 G8 (Nemotron-H-like decode), bf16 activations, fp32 state pool, batch 1/8/64/256,
T = 1/4/8. Times are CUDA-graph replays (median over replays of a graph holding several launches, each
launch on its own pool slots so nothing stays in L2), ours and Triton side by side in one fresh process per
shape; the roofline is the minimum bytes each call must move divided by the device-to-device copy bandwidth
measured in the same run. Triton at T > 1 is a loop of T single-token calls (it has no multi-token verify).
"""
from __future__ import annotations

import argparse
import functools

import torch

from common import copy_bandwidth, eager_time_us, graph_time_us, rotation, side_by_side

H, P, N, G = 128, 64, 128, 8
BATCHES = (1, 8, 64, 256)
TS = (1, 4, 8)


def inputs(batch, T, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    return {
        "x": r(batch, T, H, P).bfloat16(), "dt": (0.5 * r(batch, T, H)).bfloat16(),
        "A": -torch.exp(torch.rand(H, generator=g, device="cuda") * 2.77), "B": r(batch, T, G, N).bfloat16(),
        "C": r(batch, T, G, N).bfloat16(), "D": r(H), "z": r(batch, T, H, P).bfloat16(),
        "dt_bias": torch.full((H,), -3.0, device="cuda"),
    }


def state_bytes(batch):
    return batch * H * P * N * 4


def io_bytes(batch, T):
    return batch * T * (3 * H * P * 2 + 2 * G * N * 2 + H * 2)  # x, z, out; B, C; dt


def bench_ours(batch, T, bw, modes=("update", "snapshot", "compact")):
    from mamba2_aot import runtime
    kw = inputs(batch, T)
    rotate = rotation(state_bytes(batch))
    pools = [torch.randn(batch * (T + 1), H, P, N, device="cuda") for _ in range(rotate)]
    out = torch.empty(batch, T, H, P, dtype=torch.bfloat16, device="cuda")
    src = torch.arange(batch, dtype=torch.int32, device="cuda")
    snaps = (batch + torch.arange(batch * T, dtype=torch.int32, device="cuda")).view(batch, T)
    cap = max(TS)
    slots = pools[0].shape[0]
    windows = [{"window_count": torch.full((slots, H), T, dtype=torch.int32, device="cuda"),
                "window_x": torch.randn(slots, cap, H, P, device="cuda").bfloat16(),
                "window_B": torch.randn(slots, cap, H, N, device="cuda").bfloat16(),
                "window_dt": torch.full((slots, cap, H), -3.0, device="cuda").bfloat16()} for _ in range(rotate)]
    accept = torch.full((batch,), T, dtype=torch.int32, device="cuda")
    none_accepted = torch.zeros(batch, dtype=torch.int32, device="cuda")
    common = dict(out=out, state_indices=src, dt_softplus=True, **kw)
    runtime.preload(["verify"])
    rows = {}

    def update(i):
        runtime.launch("verify", mode="update", state=pools[i], **common)
    rows["update"] = graph_time_us(update, rotate)
    update_eager_us = eager_time_us(update, rotate)
    if "snapshot" in modes:
        rows["snapshot"] = graph_time_us(lambda i: runtime.launch(
            "verify", mode="snapshot", state=pools[i], snapshot_indices=snaps, **common), rotate)

    def compact(i, accepted):
        # restore the pending count the previous replay consumed, as a real decode loop's last call did
        windows[i]["window_count"].fill_(T)
        runtime.launch("verify", mode="compact", state=pools[i], num_accepted=accepted, **windows[i], **common)
    if "compact" in modes:
        fill = graph_time_us(lambda i: windows[i]["window_count"].fill_(T), rotate)
        rows["compact"] = graph_time_us(lambda i: compact(i, accept), rotate) - fill
        rows["compact_no_fold"] = graph_time_us(lambda i: compact(i, none_accepted), rotate) - fill
    floors = {"update": 2 * state_bytes(batch), "snapshot": (1 + T) * state_bytes(batch),
              "compact": 2 * state_bytes(batch), "compact_no_fold": state_bytes(batch)}
    result = {mode: {"us": t, "floor_us": (floors[mode] + io_bytes(batch, T)) / bw * 1e6} for mode, t in rows.items()}
    result["update"]["eager_us"] = update_eager_us
    return result


def bench_triton(batch, T):
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    kw = inputs(batch, T)
    rotate = rotation(state_bytes(batch))
    pools = [torch.randn(batch, H, P, N, device="cuda") for _ in range(rotate)]
    A = kw["A"][:, None, None].expand(H, P, N)
    dt_bias = kw["dt_bias"][:, None].expand(H, P)
    D = kw["D"][:, None].expand(H, P)
    idx = torch.arange(batch, dtype=torch.int32, device="cuda")

    def run(i):
        for t in range(T):
            selective_state_update(pools[i], kw["x"][:, t], kw["dt"][:, t, :, None].expand(batch, H, P), A,
                                   kw["B"][:, t], kw["C"][:, t], D=D, z=kw["z"][:, t], dt_bias=dt_bias,
                                   dt_softplus=True, state_batch_indices=idx)
    return {"us": graph_time_us(run, rotate), "eager_us": eager_time_us(run, rotate)}


def measure(batch, T, bw, baseline=True, modes=("update", "snapshot", "compact")) -> dict:
    """Ours (:func:`bench_ours`) and, with ``baseline``, Triton's (:func:`bench_triton`, under ``"triton"``, None
    when it failed) side by side in one fresh process; without it ours alone in one."""
    ours = functools.partial(bench_ours, bw=bw, modes=modes)
    mine, triton = side_by_side(ours, bench_triton if baseline else None, batch, T)
    return {**mine, "triton": triton} if baseline else mine


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--ts", type=int, nargs="+", default=TS)
    parser.add_argument("--no-baseline", action="store_true", help="skip Triton's selective_state_update")
    args = parser.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'batch':>5} {'T':>2} {'triton':>8} {'update':>8} {'(roof%)':>7} {'snapshot':>8} {'(roof%)':>7} "
          f"{'compact':>8} {'nofold':>8} {'upd/tri':>7} {'snap/cmp':>8}")
    for batch in args.batches:
        for T in args.ts:
            ours = measure(batch, T, bw, baseline=not args.no_baseline)
            triton = ours.get("triton")
            triton_us = float("nan") if triton is None else triton["us"]
            u, s, c = ours["update"], ours["snapshot"], ours["compact"]
            print(f"{batch:>5} {T:>2} {triton_us:8.1f} {u['us']:8.1f} {100 * u['floor_us'] / u['us']:6.0f}% "
                  f"{s['us']:8.1f} {100 * s['floor_us'] / s['us']:6.0f}% {c['us']:8.1f} "
                  f"{ours['compact_no_fold']['us']:8.1f} {triton_us / u['us']:7.2f} {s['us'] / c['us']:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
