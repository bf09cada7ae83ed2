"""Prefill → decode through both pools with no host-side glue (issue: the pre-conv path), on the GPU.

conv1d_fwd runs the causal conv over packed sequences (cu_seqlens) and leaves each sequence's final conv window in
its slot of a conv pool; ssd_fwd reads x, B and C as column views of the conv output and leaves each final SSM
state in the same slot of an SSM pool; the fused verify then decodes T more tokens per sequence from those slots.
The decoded outputs, and both pools afterwards, must match the fp64 oracle run over each whole sequence (conv,
rounded to bf16 as the kernels pass it on, then the SSM). The packed row ends with padding outside every
sequence, in a conv output buffer that held NaN: conv1d_fwd zeroes those rows, so ssd_fwd reads them safely.
"""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import reference  # noqa: E402
from built_variants import require_built  # noqa: E402
from test_verify_gpu import _runtime  # noqa: E402

H, P, N, G, K = 4, 64, 128, 2, 4
CHANNELS = H * P + 2 * G * N


def _split(xBC):
    """Mamba-2's [x | B | C] channel split, as column views."""
    x = xBC[..., :H * P].unflatten(-1, (H, P))
    B = xBC[..., H * P:H * P + G * N].unflatten(-1, (G, N))
    C = xBC[..., H * P + G * N:].unflatten(-1, (G, N))
    return x, B, C


def test_packed_prefill_then_fused_decode_equals_one_long_run():
    for family, constants in (("conv1d_fwd", {"io_dtype": "bf16", "pool_dtype": "bf16"}),
                              ("ssd_fwd", {"headdim": P, "d_state": N, "io_dtype": "bf16", "state_dtype": "fp32"}),
                              ("verify", {"mode": "update", "headdim": P, "d_state": N, "io_dtype": "bf16",
                                          "pool_dtype": "fp32", "conv_dtype": "bf16"})):
        require_built(family, **constants)
    lengths, T = (70, 2, 131), 3          # a sequence shorter than K - 1, and starts inside 64-token blocks
    slots = [5, 0, 3]
    gen = torch.Generator().manual_seed(7)
    seqs = [{"xBC": torch.randn(n + T, CHANNELS, generator=gen).bfloat16(),
             "dt": (torch.rand(n + T, H, generator=gen) - 2.0).bfloat16(),
             "z": torch.randn(n + T, H, P, generator=gen).bfloat16()} for n in lengths]
    layer = {"conv_weight": torch.randn(CHANNELS, K, generator=gen) * K ** -0.5,
             "conv_bias": torch.randn(CHANNELS, generator=gen) * 0.1,
             "A": -torch.exp(torch.rand(H, generator=gen) * 2.0), "D": torch.randn(H, generator=gen),
             "dt_bias": torch.randn(H, generator=gen) * 0.5}
    cuda = {k: v.cuda() for k, v in layer.items()}

    # prefill: the sequences packed along L of one row, then 20 rows of padding outside every sequence
    pad = {"xBC": torch.randn(20, CHANNELS, generator=gen).bfloat16(), "dt": torch.zeros(20, H).bfloat16(),
           "z": torch.zeros(20, H, P).bfloat16()}
    packed = {k: torch.cat([s[k][:n] for s, n in zip(seqs, lengths)] + [pad[k]])[None].cuda()
              for k in ("xBC", "dt", "z")}
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    slot_index = torch.tensor(slots, dtype=torch.int32, device="cuda")
    conv_pool = torch.zeros(8, CHANNELS, K - 1, dtype=torch.bfloat16, device="cuda")
    ssm_pool = torch.zeros(8, H, P, N, device="cuda")
    # stale NaN in the conv output buffer: conv1d_fwd must zero the padding rows that ssd_fwd then reads
    conv_out = torch.full_like(packed["xBC"], float("nan"))
    rt = _runtime()
    rt.launch("conv1d_fwd", xBC=packed["xBC"], conv_weight=cuda["conv_weight"], conv_bias=cuda["conv_bias"],
              out=conv_out, cu_seqlens=cu_seqlens, final_states=conv_pool, final_state_indices=slot_index)
    x, B, C = _split(conv_out)
    rt.launch("ssd_fwd", x=x, dt=packed["dt"], A=cuda["A"], B=B, C=C, D=cuda["D"], z=packed["z"],
              dt_bias=cuda["dt_bias"], dt_softplus=True, out=torch.empty_like(packed["z"]), cu_seqlens=cu_seqlens,
              final_states=ssm_pool, final_state_indices=slot_index)

    # decode: T more tokens of every sequence, one request per sequence, fused conv + SSM
    decode = {k: torch.stack([s[k][n:] for s, n in zip(seqs, lengths)]).cuda() for k in ("xBC", "dt", "z")}
    out = torch.full((len(lengths), T, H, P), float("nan"), dtype=torch.bfloat16, device="cuda")
    tickets = torch.zeros(8, G + 1, dtype=torch.int32, device="cuda")
    rt.launch("verify", mode="update", state=ssm_pool, state_indices=slot_index, out=out, dt_softplus=True,
              conv_state=conv_pool, tickets=tickets, xBC=decode["xBC"], dt=decode["dt"], z=decode["z"],
              **{k: cuda[k] for k in ("A", "D", "dt_bias", "conv_weight", "conv_bias")})
    torch.cuda.synchronize()

    tol = reference.TOLERANCES["bf16"]
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        conv = reference.conv1d_prefill(s["xBC"][None], layer["conv_weight"], layer["conv_bias"])
        xs, Bs, Cs = _split(conv["out"].to(torch.bfloat16))   # the kernels hand the conv output on in bf16
        ref = reference.ssd_reference(xs, s["dt"][None], layer["A"], Bs, Cs, D=layer["D"], z=s["z"][None],
                                      dt_bias=layer["dt_bias"], dt_softplus=True, return_final_states=True)
        reference.assert_close_scaled(out[i].cpu(), ref["out"][0, n:], tol["out"], f"sequence {i}: decoded out")
        reference.assert_close_scaled(ssm_pool[slots[i]].cpu(), ref["final_states"][0], tol["states"],
                                      f"sequence {i}: SSM state after decode")
        assert torch.equal(conv_pool[slots[i]].cpu().double(), conv["final_conv_states"][0]), \
            f"sequence {i}: the conv window after decode must be the last K-1 raw inputs"
    assert int(tickets.abs().sum()) == 0
