"""Benchmark the fused conv + SSM verify against the unfused pair (conv1d_verify, then verify), in one process.

    PYTHONPATH=runtime python bench/bench_conv.py      # (bench/run.py records results)

Shape: Nemotron-H-like decode, H128 P64 N128 G8 (xBC: 10240 channels), conv width 4 with bias and SiLU,
bf16 activations and conv pool, fp32 SSM pool; batch 1/8/64/256; T = 1 and 8 in update mode and T = 8 in
compact mode (all rows of the previous window accepted). Times are CUDA-graph replays, each launch on its own
pool slots (see bench/common.py). The pair writes the conv outputs to HBM and reads them back as x, B, C
(column views of one buffer); the fused call does neither and launches once.
"""
from __future__ import annotations

import argparse

import torch

from common import copy_bandwidth, graph_time_us, rotation

H, P, N, G, K = 128, 64, 128, 8, 4
CHANNELS = H * P + 2 * G * N
BATCHES = (1, 8, 64, 256)
CASES = (("update", 1), ("update", 8), ("compact", 8))
CAPACITY = 8


def _inputs(batch, T, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    return {
        "xBC": r(batch, T, CHANNELS).bfloat16(), "dt": (0.5 * r(batch, T, H)).bfloat16(),
        "A": -torch.exp(torch.rand(H, generator=g, device="cuda") * 2.77), "D": r(H),
        "z": r(batch, T, H, P).bfloat16(), "dt_bias": torch.full((H,), -3.0, device="cuda"),
        "conv_weight": r(CHANNELS, K) * 0.5, "conv_bias": r(CHANNELS) * 0.1,
    }


def _pools(batch, T):
    """One call's pools and window records (slots 0..batch-1), fresh random state."""
    slots = batch
    return {
        "state": torch.randn(slots, H, P, N, device="cuda"),
        "conv_state": torch.randn(slots, CHANNELS, K - 1, device="cuda").bfloat16(),
        "window_count": torch.full((slots, H), T, dtype=torch.int32, device="cuda"),
        "window_x": torch.randn(slots, CAPACITY, H, P, device="cuda").bfloat16(),
        "window_B": torch.randn(slots, CAPACITY, H, N, device="cuda").bfloat16(),
        "window_dt": torch.full((slots, CAPACITY, H), -3.0, device="cuda").bfloat16(),
        "conv_window_count": torch.full((slots,), T, dtype=torch.int32, device="cuda"),
        "conv_window_xBC": torch.randn(slots, CAPACITY, CHANNELS, device="cuda").bfloat16(),
        "tickets": torch.zeros(slots, dtype=torch.int32, device="cuda"),              # conv1d_verify's
        "fused_tickets": torch.zeros(slots, G + 1, dtype=torch.int32, device="cuda"),  # the fused verify's
    }


def measure(batch, mode, T, bw):
    """{"fused_us", "pair_us", "conv_us" (the pair's conv1d_verify alone), "saving_us", "floor_us"}."""
    from mamba2_aot import runtime
    kw = _inputs(batch, T)
    state_bytes = batch * H * P * N * 4
    rotate = rotation(2 * state_bytes)
    pools = [_pools(batch, T) for _ in range(rotate)]
    out = torch.empty(batch, T, H, P, dtype=torch.bfloat16, device="cuda")
    conv_out = torch.empty(batch, T, CHANNELS, dtype=torch.bfloat16, device="cuda")
    x = conv_out[..., :H * P].unflatten(-1, (H, P))
    B = conv_out[..., H * P:H * P + G * N].unflatten(-1, (G, N))
    C = conv_out[..., H * P + G * N:].unflatten(-1, (G, N))
    idx = torch.arange(batch, dtype=torch.int32, device="cuda")
    accepted = torch.full((batch,), T, dtype=torch.int32, device="cuda")
    conv_args = {k: kw[k] for k in ("xBC", "conv_weight", "conv_bias")}
    ssm_args = {k: kw[k] for k in ("dt", "A", "D", "z", "dt_bias")}
    compact = mode == "compact"
    runtime.preload(["verify", "conv1d_verify"])

    def pool_args(i, names):
        return {name: pools[i][name] for name in names}

    ssm_window = ("window_count", "window_x", "window_B", "window_dt") if compact else ()
    conv_window = ("conv_window_count", "conv_window_xBC", "tickets") if compact else ()
    extra = {"num_accepted": accepted} if compact else {}

    def restore(i):   # the pending counts the previous replay consumed, as a decode loop's last call left them
        if compact:
            pools[i]["window_count"].fill_(T)
            pools[i]["conv_window_count"].fill_(T)

    def conv(i):
        runtime.launch("conv1d_verify", mode=mode, out=conv_out, state_indices=idx, conv_state=pools[i]["conv_state"],
                       **conv_args, **pool_args(i, conv_window), **extra)

    def pair(i):
        restore(i)
        conv(i)
        runtime.launch("verify", mode=mode, state=pools[i]["state"], x=x, B=B, C=C, out=out, state_indices=idx,
                       dt_softplus=True, **ssm_args, **pool_args(i, ssm_window), **extra)

    def fused(i):
        restore(i)
        runtime.launch("verify", mode=mode, state=pools[i]["state"], out=out, state_indices=idx, dt_softplus=True,
                       **conv_args, **ssm_args,
                       tickets=pools[i]["fused_tickets"],
                       **pool_args(i, ("conv_state",) + ssm_window + conv_window[:2]), **extra)

    base = graph_time_us(restore, rotate) if compact else 0.0
    result = {"fused_us": graph_time_us(fused, rotate) - base, "pair_us": graph_time_us(pair, rotate) - base,
              "conv_us": graph_time_us(lambda i: (restore(i), conv(i)), rotate) - base}
    result["saving_us"] = result["pair_us"] - result["fused_us"]
    conv_bytes = batch * CHANNELS * 2 * (2 * (K - 1) + T)   # conv state read + written, xBC read
    io_bytes = batch * T * (2 * H * P * 2 + H * 2)           # z, out; dt
    result["floor_us"] = (2 * state_bytes + conv_bytes + io_bytes) / bw * 1e6
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    args = parser.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'batch':>5} {'mode':>8} {'T':>2} {'pair':>8} {'(conv)':>8} {'fused':>8} {'saving':>8} {'pair/fused':>10}")
    for batch in args.batches:
        for mode, T in CASES:
            r = measure(batch, mode, T, bw)
            print(f"{batch:>5} {mode:>8} {T:>2} {r['pair_us']:8.1f} {r['conv_us']:8.1f} {r['fused_us']:8.1f} "
                  f"{r['saving_us']:8.1f} {r['pair_us'] / r['fused_us']:10.2f}", flush=True)


if __name__ == "__main__":
    main()
