"""A small launch of every built family and mode, for ``compute-sanitizer`` (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck python tests/sanitizer_workload.py
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent / "runtime")]
import conftest  # noqa: E402,F401  (the runtime and cubins of the source tree, as the tests use them)
from mamba2_aot import dispatch, runtime  # noqa: E402
from mamba2_aot.plans import ssd_bwd, ssd_fwd  # noqa: E402

dev = "cuda"
batch, T, H, P, N, G, slots, cap = 3, 4, 8, 64, 128, 2, 16, 8
x = torch.randn(batch, T, H, P, device=dev).bfloat16()
common = dict(x=x, dt=torch.randn(batch, T, H, device=dev).bfloat16(), A=-torch.rand(H, device=dev),
              B=torch.randn(batch, T, G, N, device=dev).bfloat16(), C=torch.randn(batch, T, G, N, device=dev).bfloat16(),
              D=torch.randn(H, P, device=dev), z=torch.randn_like(x), dt_bias=torch.randn(H, device=dev),
              dt_softplus=True, state_indices=torch.tensor([2, -1, 16], dtype=torch.int32, device=dev),
              rejected=torch.zeros(1, dtype=torch.int32, device=dev))
for pool_dtype in (torch.float32, torch.bfloat16):
    pool = torch.randn(slots, H, P, N, device=dev).to(pool_dtype)
    runtime.launch("verify", mode="update", state=pool, out=torch.empty_like(x), **common)
    runtime.launch("verify", mode="snapshot", state=pool, out=torch.empty_like(x),
                   snapshot_indices=torch.tensor([[3, 4, -1, 99], [5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32,
                                                 device=dev), **common)
    # a decode (T = 1: inputs read into registers, no staging) of the first tokens
    step = {k: (v[:, :1] if isinstance(v, torch.Tensor) and v.dim() >= 3 else v) for k, v in common.items()}
    runtime.launch("verify", mode="update", state=pool, out=torch.empty_like(x[:, :1]), **step)
    runtime.launch("verify", mode="snapshot", state=pool, out=torch.empty_like(x[:, :1]),
                   snapshot_indices=torch.tensor([[3], [5], [99]], dtype=torch.int32, device=dev), **step)
    window = dict(window_count=torch.zeros(slots, H, dtype=torch.int32, device=dev),
                  window_x=torch.zeros(slots, cap, H, P, device=dev).bfloat16(),
                  window_B=torch.zeros(slots, cap, H, N, device=dev).bfloat16(),
                  window_dt=torch.zeros(slots, cap, H, device=dev).bfloat16())
    for accepted in (0, 3, 9):
        runtime.launch("verify", mode="compact", state=pool, out=torch.empty_like(x), **window,
                       num_accepted=torch.full((batch,), accepted, dtype=torch.int32, device=dev), **common)

# ssd_chunk_cumsum: 20 heads, a whole tile of 16 heads and a partial one
dt = torch.randn(2, 300, 20, device=dev)
for Q in (64, 256):
    nchunks = -(-300 // Q)
    outputs = [torch.empty(2, 20, nchunks, Q, device=dev) for _ in range(2)]
    runtime.launch("ssd_chunk_cumsum", dt=dt, A=-torch.rand(20, device=dev), chunk_size=Q, dt_softplus=True,
                   dt_out=outputs[0], dA_cumsum=outputs[1])
# ssd_fwd: a partial last block, packed sequences starting inside blocks (both forms) with pools in place, chunk
# states, splits along L (few CTAs, a long row: a states-only pass, then the segments, entering states in the
# workspace; or one launch with an inline pass), a handover (more CTAs than the GPU runs at once: segments handing
# their states over in one launch)
L = 150
lengths = [70, 1, 79]
cu_seqlens = torch.tensor([0, 70, 71, 150], dtype=torch.int32, device=dev)
seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32, device=dev),
                                  torch.tensor(lengths, device=dev))[None]
slots_used = torch.tensor([4, -1, 15], dtype=torch.int32, device=dev)


def forward(N):
    xs = torch.randn(1, L, H, P, device=dev).bfloat16()
    prefill = dict(x=xs, dt=torch.randn(1, L, H, device=dev).bfloat16(), A=-torch.rand(H, device=dev),
                   B=torch.randn(1, L, G, N, device=dev).bfloat16(), C=torch.randn(1, L, G, N, device=dev).bfloat16(),
                   D=torch.randn(H, device=dev), z=torch.randn_like(xs), dt_bias=torch.randn(H, device=dev),
                   dt_softplus=True, chunk_size=64)
    for packing in ({"cu_seqlens": cu_seqlens}, {"seq_idx": seq_idx}):
        for state_dtype in (torch.float32, torch.bfloat16):
            pool = torch.randn(slots, H, P, N, device=dev).to(state_dtype)
            runtime.launch("ssd_fwd", out=torch.empty_like(xs), initial_states=pool, final_states=pool,
                           initial_state_indices=slots_used, final_state_indices=slots_used, **packing, **prefill)
    runtime.launch("ssd_fwd", out=torch.empty_like(xs), final_states=torch.empty(1, H, P, N, device=dev),
                   chunk_states=torch.empty(1, 3, H, P, N, device=dev), **prefill)
    # splits along L (a states-only pass of 960 tokens: one launch with an inline pass where the heads pair, else two
    # launches, and without a workspace unsplit; of 2880: two launches), the handover; then each without z (at N 128
    # on ssd_fwd_inline's variants without z slots wherever the heads pair: the inline pass, the segments after a
    # states-only pass, the handover, the unsplit call)
    for heads, length, gated in ((2, 1100, True), (2, 3000, True), (270, 512, True), (2, 1100, False),
                                 (2, 3000, False), (270, 512, False)):
        call = dict(x=torch.randn(1, length, heads, P, device=dev).bfloat16(),
                    dt=torch.randn(1, length, heads, device=dev).bfloat16(), A=-torch.rand(heads, device=dev),
                    B=torch.randn(1, length, 1, N, device=dev).bfloat16(),
                    C=torch.randn(1, length, 1, N, device=dev).bfloat16(),
                    z=torch.randn(1, length, heads, P, device=dev).bfloat16() if gated else None,
                    initial_states=torch.randn(1, heads, P, N, device=dev), dt_softplus=True, chunk_size=256)
        size = runtime.workspace_size("ssd_fwd", x=call["x"], B=call["B"])
        runtime.launch("ssd_fwd", out=torch.empty_like(call["x"]), final_states=torch.empty(1, heads, P, N, device=dev),
                       workspace=torch.empty(size // 4, device=dev) if size else None, **call)
        if length == 1100:
            runtime.launch("ssd_fwd", out=torch.empty_like(call["x"]),
                           final_states=torch.empty(1, heads, P, N, device=dev), **call)


# every launch on the walk, then every launch a CTA of two heads can run on one (ssd_fwd_paired with z at N 128, else
# ssd_fwd_inline; sm_90a, elsewhere their cubins are the walk) however few its CTAs: the seq_idx calls stay on the
# walk (a split call's states-only pass runs on ssd_fwd_pass)
paired_pays = ssd_fwd.paired_pays
for pairing in (False, True):
    ssd_fwd.paired_pays = lambda pairs, pairing=pairing: pairing
    dispatch._recent_calls.clear()  # (a memoised call would skip the plan's choice)
    for d_state in (64, N) if pairing else (64, N, 256):  # (N 256 never pairs; its split's pass has a ring of two)
        forward(d_state)
ssd_fwd.paired_pays = paired_pays
# the pre-conv path: prefill into a conv pool in place (packed, a short sequence), the three conv pool modes, and
# the fused conv + SSM verify in each mode (padding and out-of-range rows, the tickets' last-arrival writes)
K = 4
channels = H * P + 2 * G * N
conv = dict(conv_weight=torch.randn(channels, K, device=dev), conv_bias=torch.randn(channels, device=dev))
conv_pool = torch.randn(slots, channels, K - 1, device=dev).bfloat16()
xBC_prefill = torch.randn(1, L, channels, device=dev).bfloat16()
runtime.launch("conv1d_fwd", xBC=xBC_prefill, out=torch.empty_like(xBC_prefill), cu_seqlens=cu_seqlens,
               initial_states=conv_pool, final_states=conv_pool, initial_state_indices=slots_used,
               final_state_indices=slots_used, **conv)
xBC = torch.randn(batch, T, channels, device=dev).bfloat16()
requests = dict(state_indices=common["state_indices"], rejected=common["rejected"])
snapshots = torch.tensor([[3, 4, -1, 99], [5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32, device=dev)
tickets = torch.zeros(slots, dtype=torch.int32, device=dev)
fused_tickets = torch.zeros(slots, G + 1, dtype=torch.int32, device=dev)
conv_window = dict(conv_window_count=torch.zeros(slots, dtype=torch.int32, device=dev),
                   conv_window_xBC=torch.zeros(slots, cap, channels, device=dev).bfloat16())
for mode, extra in (("update", {}), ("snapshot", {"snapshot_indices": snapshots}),
                    ("compact", {"num_accepted": torch.full((batch,), 2, dtype=torch.int32, device=dev),
                                 "tickets": tickets, **conv_window})):
    runtime.launch("conv1d_verify", mode=mode, conv_state=conv_pool, xBC=xBC, out=torch.empty_like(xBC), **conv,
                   **requests, **extra)
ssm = {k: common[k] for k in ("dt", "A", "D", "z", "dt_bias", "dt_softplus")}
pool = torch.randn(slots, H, P, N, device=dev)
window = dict(window_count=torch.zeros(slots, H, dtype=torch.int32, device=dev),
              window_x=torch.zeros(slots, cap, H, P, device=dev).bfloat16(),
              window_B=torch.zeros(slots, cap, H, N, device=dev).bfloat16(),
              window_dt=torch.zeros(slots, cap, H, device=dev).bfloat16())
for mode, extra in (("update", {}), ("snapshot", {"snapshot_indices": snapshots}),
                    ("compact", {"num_accepted": torch.full((batch,), 2, dtype=torch.int32, device=dev),
                                 **window, **conv_window})):
    runtime.launch("verify", mode=mode, state=pool, out=torch.empty_like(x), conv_state=conv_pool, xBC=xBC,
                   tickets=fused_tickets, **conv, **ssm, **requests, **extra)

# ssd_bwd: a partial last block, every option (the states-only recompute), then without z, then packed sequences
# starting inside blocks (both forms: the whole forward recomputed), then P128 (the chunk kernel's heads in slices) and
# N256 (its columns of N in two parts, whose shares ssd_bwd_reduce adds), and an empty batch (ssd_bwd_reduce alone)
def backward(L, G_, packing=None, num_seqs=1, gated=True, P=P, N=N, batch=1):
    f = dict(x=torch.randn(batch, L, H, P, device=dev).bfloat16(), dt=torch.randn(batch, L, H, device=dev).bfloat16(),
             A=-torch.rand(H, device=dev), B=torch.randn(batch, L, G_, N, device=dev).bfloat16(),
             C=torch.randn(batch, L, G_, N, device=dev).bfloat16(), D=torch.randn(H, device=dev),
             z=torch.randn(batch, L, H, P, device=dev).bfloat16(), dt_bias=torch.randn(H, device=dev), dt_softplus=True,
             initial_states=torch.randn(num_seqs, H, P, N, device=dev), **(packing or {}))
    grads = dict(dx=torch.empty_like(f["x"]), ddt=torch.empty_like(f["dt"]), dA=torch.empty(H, device=dev),
                 dB=torch.empty_like(f["B"]), dC=torch.empty_like(f["C"]), dD=torch.empty(H, device=dev),
                 dz=torch.empty_like(f["z"]), ddt_bias=torch.empty(H, device=dev),
                 dinitial_states=torch.empty(num_seqs, H, P, N, device=dev))
    if not gated:
        del f["z"], grads["dz"]
    workspace = torch.empty(runtime.workspace_size("ssd_bwd", x=f["x"], B=f["B"]) // 4, device=dev)
    runtime.launch("ssd_bwd", dout=torch.randn_like(f["x"]), dfinal_states=torch.randn(num_seqs, H, P, N, device=dev),
                   workspace=workspace, **f, **grads)


backward(150, G)
backward(150, G, gated=False)
cu = torch.tensor([0, 1, 70, 71, 150], dtype=torch.int32, device=dev)
backward(150, 1, {"cu_seqlens": cu}, num_seqs=4)
backward(150, 1, {"seq_idx": torch.repeat_interleave(torch.arange(4, dtype=torch.int32, device=dev),
                                                     (cu[1:] - cu[:-1]).long())[None]}, num_seqs=4)
backward(150, G, {"cu_seqlens": cu}, num_seqs=4, P=128)
backward(150, G, {"cu_seqlens": cu}, num_seqs=4, N=256)
ssd_bwd.TARGET_CTAS = 1  # (N 256 without head splits too: dB and dC written by the chunk pass itself)
backward(150, G, N=256)
backward(150, G, num_seqs=0, batch=0)

torch.cuda.synchronize()
assert int(tickets.abs().sum()) == 0 and int(fused_tickets.abs().sum()) == 0
print("sanitizer workload done")
