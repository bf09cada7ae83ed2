"""verify's update and snapshot modes on the GPU against the fp64 oracle over drawn combinations (hypothesis).

tests/test_verify_gpu.py holds fixed calls and the bitwise equivalences (one-token calls, compact replay); here every
option is drawn at once: the built variant (P, N, I/O and pool dtype), heads and groups, batch and T, D's shape, z,
dt_bias, softplus, dt_limit, the slots (padding rows, slots past the pool, spare slots), the snapshot targets
(skipped, past the pool), one CTA or two per state, and x / z / B / C / dt as column views of one fused projection.
Each example checks the outputs (zero on rows that do not run), the slots written, that every other slot and the
memory either side of the pool keep their bytes, that ``rejected`` is added to by the slots past the pool, and that
no input was written.

The draws are derandomized (the same examples every run); a failure prints the falsifying draw. Needs a CUDA device
and the built cubins; see tests/conftest.py.
"""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")  # (requirements/test.txt has it; a bare GPU image may not)
pytestmark = pytest.mark.gpu

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import reference  # noqa: E402
from built_variants import built_constants  # noqa: E402
from reference import generators  # noqa: E402
from test_ssd_properties_gpu import SETTINGS, _fused_projection, draw_dt_bias_and_softplus  # noqa: E402
from test_verify_gpu import TORCH_DTYPES, _tolerances  # noqa: E402

DT_LIMITS = [(0.0, math.inf), (0.0, 0.1), (1e-3, 0.2)]
ORACLES = {"update": reference.verify_update, "snapshot": reference.verify_snapshot}


def _variants():
    """The built verify variants of the modes drawn here, without the fused pre-conv."""
    return [c for c in built_constants("verify") if c["conv_dtype"] == "none" and c["mode"] in ORACLES]


PAST_THE_END = "past the end"  # (a slot at or past the pool's end, set once its size is known)


@st.composite
def slot_draws(draw, count, free):
    """``count`` slots: each a distinct slot taken from the list ``free`` (in place), a negative one (not used) or
    one at or past the pool's end (rejected). Returns (slots, how many lie past the end)."""
    slots, past = [], 0
    for _ in range(count):
        kind = draw(st.sampled_from(["slot", "slot", "slot", "negative", PAST_THE_END]))
        if kind == "slot" and free:
            slots.append(free.pop(draw(st.integers(0, len(free) - 1))))
        elif kind == PAST_THE_END:
            slots.append((PAST_THE_END, draw(st.sampled_from([0, 1, 2**31 - 1]))))
            past += 1
        else:
            slots.append(draw(st.sampled_from([-1, -2, -2**31])))
    return slots, past


@SETTINGS
@given(data=st.data())
def test_verify_matches_oracle_over_drawn_options(data):
    c = data.draw(st.sampled_from(_variants() or [{}]), "variant")
    P, N, mode, io, pool_dtype = c["headdim"], c["d_state"], c["mode"], TORCH_DTYPES[c["io_dtype"]], c["pool_dtype"]
    H = data.draw(st.integers(1, 8), "heads")
    G = data.draw(st.sampled_from([g for g in range(1, H + 1) if H % g == 0]), "groups")
    batch = data.draw(st.integers(1, 6), "batch")
    T = data.draw(st.integers(1, 24), "T")
    inputs = generators.standard_inputs(batch, T, H, P, N, G, io, data.draw(st.integers(0, 2**16), "seed"),
                                        D=data.draw(st.sampled_from([None, "H", "HP"]), "D"),
                                        z=data.draw(st.booleans(), "z"))
    draw_dt_bias_and_softplus(data.draw, inputs)
    inputs["dt_limit"] = data.draw(st.sampled_from(DT_LIMITS), "dt_limit")

    spare = data.draw(st.integers(0, 3), "spare slots")
    num_slots = batch * (T + 1 if mode == "snapshot" else 1) + spare
    free = list(range(num_slots))
    sources, rejected = data.draw(slot_draws(batch, free), "state_indices")

    def placed(slot):
        return slot if isinstance(slot, int) else min(num_slots + slot[1], 2**31 - 1)

    sources = [placed(s) for s in sources]
    runs = [b for b, s in enumerate(sources) if 0 <= s < num_slots]
    extra, targets = {}, []
    if mode == "snapshot":
        for b in range(batch):
            row, past = data.draw(slot_draws(T, free), f"snapshot_indices of row {b}")
            rejected += past if b in runs else 0  # (a row that does not run reads none of its targets)
            targets.append([placed(s) for s in row])

    cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    if data.draw(st.booleans(), "fused projection views"):
        cuda.update(_fused_projection(cuda))
    state_indices = torch.tensor(sources, dtype=torch.int32, device="cuda")
    if mode == "snapshot":
        extra["snapshot_indices"] = torch.tensor(targets, dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(num_slots)
    # a slot's worth of memory either side of the pool, which no call may write
    backing = torch.randn(num_slots + 2, H, P, N, generator=gen).to(TORCH_DTYPES[pool_dtype]).cuda()
    backing_before = backing.clone()
    pool, pool_before = backing[1:-1], backing_before[1:-1]
    out = torch.full((batch, T, H, P), float("nan"), dtype=io, device="cuda")
    counted = torch.full((1,), 5, dtype=torch.int32, device="cuda")  # (a count is added to, not overwritten)
    given = {k: v for k, v in {**cuda, **extra, "state_indices": state_indices}.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in given.items()}
    from mamba2_aot import runtime
    from mamba2_aot.plans import verify
    with pytest.MonkeyPatch.context() as mp:
        if data.draw(st.booleans(), "one CTA per state"):
            mp.setattr(verify, "SPLIT_AT_MOST", 0)
        runtime.launch("verify", mode=mode, state=pool, out=out, state_indices=state_indices, rejected=counted,
                       **cuda, **extra)
    torch.cuda.synchronize()

    oracle_args = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    oracle_extra = {k: v.cpu() for k, v in extra.items()}
    ref = ORACLES[mode](pool_before.cpu(), state_indices.cpu(), pool_dtype=TORCH_DTYPES[pool_dtype], **oracle_args,
                        **oracle_extra)
    tol_out, tol_states = _tolerances(c["io_dtype"], pool_dtype)
    if runs:  # (rows that do not run would lower the outputs' scale)
        reference.assert_close_scaled(out[runs].cpu(), ref.out[runs], tol_out, "out")
    for b, slot in enumerate(sources):
        if b not in runs:
            assert torch.all(out[b] == 0), f"row {b} (slot {slot}) does not run: its outputs are zero"
    written = sorted({sources[b] for b in runs} if mode == "update"
                     else {s for b in runs for s in targets[b] if 0 <= s < num_slots})
    if written:
        reference.assert_close_scaled(pool[written].float().cpu(), ref.pool[written], tol_states, "slots written")
    for slot in sorted(set(range(num_slots)) - set(written)):
        assert torch.equal(pool[slot], pool_before[slot]), f"slot {slot} was not named but was written"
    assert torch.equal(backing[[0, -1]], backing_before[[0, -1]]), "memory either side of the pool was written"
    assert counted.item() == 5 + rejected, "the rejected count"
    for k, v in before.items():
        assert torch.equal(v, given[k]), f"input {k} was written"
