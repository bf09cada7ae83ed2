"""verify's update and snapshot modes on the GPU against the fp64 oracle over drawn combinations (hypothesis).

tests/test_verify_gpu.py holds fixed calls and the bitwise equivalences (one-token calls, compact replay); here every
option is drawn at once: the built variant (P, N, I/O and pool dtype), heads and groups, batch and T, D's shape, z,
dt_bias, softplus, dt_limit, the slots (padding rows, slots past the pool, spare slots), the snapshot targets
(skipped, past the pool), and x / z / B / C / dt as column views of one fused projection. Each example checks the
outputs (zero on rows that do not run), the slots written, that every other slot keeps its bytes, the ``rejected``
count, and that no input was written.

The draws are derandomized (the same examples every run); a failure prints the falsifying draw. Needs a CUDA device
and the built cubins; see tests/conftest.py.
"""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")  # (requirements/test.txt has it; a bare GPU image may not)
pytestmark = pytest.mark.gpu

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import reference  # noqa: E402
from built_variants import built_constants  # noqa: E402
from reference import generators  # noqa: E402
from test_ssd_properties_gpu import _fused_projection  # noqa: E402
from test_verify_gpu import TORCH_DTYPES, _tolerances  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DT_LIMITS = [(0.0, math.inf), (0.0, 0.1), (1e-3, 0.2)]
ORACLES = {"update": reference.verify_update, "snapshot": reference.verify_snapshot}


def _variants():
    """The built verify variants of the modes drawn here, without the fused pre-conv."""
    return [c for c in built_constants("verify") if c["conv_dtype"] == "none" and c["mode"] in ORACLES]


@st.composite
def slot_draws(draw, count, free):
    """``count`` slots: each a distinct slot taken from the list ``free`` (in place), -1 (not used) or one past the
    pool's end (counted as rejected). Returns (slots, how many lie past the end)."""
    slots, past = [], 0
    for _ in range(count):
        kind = draw(st.sampled_from(["slot", "slot", "slot", "unused", "past the end"]))
        if kind == "slot" and free:
            slots.append(free.pop(draw(st.integers(0, len(free) - 1))))
        elif kind == "past the end":
            slots.append(-2)  # (set once the pool's size is known)
            past += 1
        else:
            slots.append(-1)
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
    if not data.draw(st.booleans(), "dt_bias"):
        del inputs["dt_bias"]
    inputs["dt_softplus"] = data.draw(st.booleans(), "dt_softplus")
    if not inputs["dt_softplus"] and "dt_bias" in inputs:  # (the generator's bias is Δ's inverse softplus: Δ here)
        inputs["dt_bias"] = torch.nn.functional.softplus(inputs["dt_bias"])
    inputs["dt_limit"] = data.draw(st.sampled_from(DT_LIMITS), "dt_limit")

    spare = data.draw(st.integers(0, 3), "spare slots")
    num_slots = batch * (T + 1 if mode == "snapshot" else 1) + spare
    free = list(range(num_slots))
    sources, rejected = data.draw(slot_draws(batch, free), "state_indices")
    extra, targets = {}, []
    if mode == "snapshot":
        for b in range(batch):
            if sources[b] >= 0:
                row, past = data.draw(slot_draws(T, free), f"snapshot_indices of row {b}")
                rejected += past
            else:  # (a row that does not run reads none of its targets)
                row = [-1] * T
            targets.append(row)
    sources = [num_slots if s == -2 else s for s in sources]
    targets = [[num_slots if s == -2 else s for s in row] for row in targets]

    cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    if data.draw(st.booleans(), "fused projection views"):
        cuda.update(_fused_projection(cuda))
    state_indices = torch.tensor(sources, dtype=torch.int32, device="cuda")
    if mode == "snapshot":
        extra["snapshot_indices"] = torch.tensor(targets, dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(num_slots)
    pool = torch.randn(num_slots, H, P, N, generator=gen).to(TORCH_DTYPES[pool_dtype]).cuda()
    pool_before = pool.clone()
    out = torch.full((batch, T, H, P), float("nan"), dtype=io, device="cuda")
    counted = torch.zeros(1, dtype=torch.int32, device="cuda")
    before = {k: v.clone() for k, v in cuda.items() if isinstance(v, torch.Tensor)}
    from mamba2_aot import runtime
    runtime.launch("verify", mode=mode, state=pool, out=out, state_indices=state_indices, rejected=counted,
                   **cuda, **extra)
    torch.cuda.synchronize()

    oracle_args = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    oracle_extra = {k: v.cpu() for k, v in extra.items()}
    ref = ORACLES[mode](pool_before.cpu(), state_indices.cpu(), pool_dtype=TORCH_DTYPES[pool_dtype], **oracle_args,
                        **oracle_extra)
    tol_out, tol_states = _tolerances(c["io_dtype"], pool_dtype)
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    for b, slot in enumerate(sources):
        if not 0 <= slot < num_slots:
            assert torch.all(out[b] == 0), f"row {b} (slot {slot}) does not run: its outputs are zero"
    written = sorted({s for s in sources if 0 <= s < num_slots} if mode == "update"
                     else {s for row in targets for s in row if 0 <= s < num_slots})
    if written:
        reference.assert_close_scaled(pool[written].float().cpu(), ref.pool[written], tol_states, "slots written")
    for slot in sorted(set(range(num_slots)) - set(written)):
        assert torch.equal(pool[slot], pool_before[slot]), f"slot {slot} was not named but was written"
    assert counted.item() == rejected, "the rejected count"
    for k, v in before.items():
        assert torch.equal(v, cuda[k]), f"input {k} was written"
