"""Two heads per CTA on the GPU: every ssd_fwd GPU test again, with every launch a CTA of two heads can run sent to one
whatever its CTA count (the tests' calls are small: the plan would keep most on the walk), on ssd_fwd_paired with z at
N 128, else on ssd_fwd_inline's cubins, and its outputs bitwise the walk's for every built variant.

Needs a CUDA device and the ssd_fwd, ssd_fwd_paired and ssd_fwd_inline cubins (``scons`` output or installed wheels);
see tests/conftest.py.
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from built_variants import built_constants  # noqa: E402
from reference import generators  # noqa: E402
from test_ssd_fwd_gpu import *  # noqa: E402,F401,F403  (collected again here, under the fixture below)
from test_ssd_fwd_gpu import TORCH_DTYPES, _run, _to_cuda  # noqa: E402


@pytest.fixture(autouse=True)
def paired_launches(monkeypatch):
    """Send every launch a CTA of two heads can run to one (``paired_pays`` always); yields the families the plan
    picked, launch by launch."""
    from mamba2_aot import dispatch
    from mamba2_aot.plans import ssd_fwd
    picked = []
    monkeypatch.setattr(dispatch, "_recent_calls", {})  # (no memoised call may skip the plan)

    def recorded(launch):
        family = launch_family(launch)
        picked.append(family)
        return family
    launch_family = ssd_fwd.launch_family
    monkeypatch.setattr(ssd_fwd, "paired_pays", lambda pairs: True)
    monkeypatch.setattr(ssd_fwd, "launch_family", recorded)
    yield picked


@pytest.fixture
def paired_variants(monkeypatch):
    """The variant constants of every ssd_fwd_paired and ssd_fwd_inline launch, launch by launch."""
    from mamba2_aot.plans import ssd_fwd
    constants = []

    def recorded(family, launch):
        family, launch = with_family_constants(family, launch)
        if family in ("ssd_fwd_paired", "ssd_fwd_inline"):
            constants.append(dict(launch.constants))
        return family, launch
    with_family_constants = ssd_fwd.with_family_constants
    monkeypatch.setattr(ssd_fwd, "with_family_constants", recorded)
    return constants


def paired_routes():
    """(z, family, variant constants) of every launch of two heads per CTA the plan makes for the built variants:
    with z at N 128 on ssd_fwd_paired, the others on ssd_fwd_inline's cubins, without z at N 128 its variant without z
    slots (``plans.ssd_fwd.launch_family``, ``with_family_constants``)."""
    paired = built_constants("ssd_fwd_paired")
    routes = []
    for c in built_constants("ssd_fwd_inline"):
        gate, base = c.get("z_gate", True), {k: v for k, v in c.items() if k != "z_gate"}
        if c["d_state"] != 128:
            routes += [(True, "ssd_fwd_inline", c), (False, "ssd_fwd_inline", c)]
        elif not gate:
            routes.append((False, "ssd_fwd_inline", c))
        elif base in paired:
            routes.append((True, "ssd_fwd_paired", base))
    return routes


ROUTES = pytest.mark.parametrize("z, family, constants", paired_routes(),
                                 ids=lambda v: "-".join(f"{k}{x}" for k, x in sorted(v.items()))
                                 if isinstance(v, dict) else f"z{v}" if isinstance(v, bool) else v)


@ROUTES
@pytest.mark.parametrize("packing", [None, "cu_seqlens"])
def test_outputs_are_the_walks_bitwise(z, family, constants, packing, paired_launches, paired_variants, monkeypatch):
    """One call of two heads per CTA (ssd_fwd_paired with z at N 128, else ssd_fwd_inline's cubins), then through the
    walk: the same bits in out, the final states and the chunk states (D per (H, P), dt_bias, dt_limit,
    initial states in the variant's state dtype, L not a multiple of 64; with cu_seqlens, sequences that start inside
    blocks and an empty one)."""
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    if packing is None:
        inputs = generators.standard_inputs(3, 200, 8, P, N, 2, TORCH_DTYPES[io], seed=P + N, D="HP", z=z,
                                            initial_states=True)
    else:
        inputs = generators.packed_inputs(8, P, N, 2, TORCH_DTYPES[io], seed=N, chunk_size=64, z=z,
                                          lengths=[70, 0, 130, 5])
        inputs.pop("seq_idx")
    inputs = _to_cuda(inputs)
    _expect_the_walks_bits(inputs, family, paired_launches, monkeypatch, chunk_size=64, final=True,
                           chunks=packing is None, state_dtype=TORCH_DTYPES[state], dt_limit=(1e-3, 0.2))
    assert paired_variants == [constants]


@ROUTES
def test_handover_calls_are_the_walks_bitwise(z, family, constants, paired_launches, paired_variants, monkeypatch):
    """A call whose segments hand their states over in one launch (flags in the workspace), two heads per CTA
    (ssd_fwd_paired with z at N 128, else ssd_fwd_inline's cubins) and through the walk: the same bits in out and the
    final states."""
    from mamba2_aot.plans import ssd_fwd
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    assert ssd_fwd.plan_handover(3, 600, 90, P, N)[0] > 1
    inputs = _to_cuda(generators.standard_inputs(3, 600, 90, P, N, 1, TORCH_DTYPES[io], seed=P + N, D="H", z=z,
                                                 initial_states=True))
    _expect_the_walks_bits(inputs, family, paired_launches, monkeypatch, final=True, state_dtype=TORCH_DTYPES[state],
                           workspace=True)
    assert paired_variants == [constants]


@pytest.mark.parametrize("constants, z", [(c, z) for c in built_constants("ssd_fwd_inline") for z in (True, False)
                                           if c["d_state"] != 128 or c.get("z_gate", True) == z],  # (the plan's routes)
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in sorted(c.items())) if isinstance(c, dict)
                         else f"z{c}")
def test_inline_pass_calls_are_the_two_launch_splits_bitwise(constants, z, paired_launches, paired_variants):
    """A split call without a workspace, in one ssd_fwd_inline launch (four segments, each after the first
    walking the state alone over the ones before it, the last short and ending inside a block), against the same call
    with a workspace, split in two launches (its pass of 2304 tokens is too long for an inline pass: the states-only
    pass, then the segments, with z at N 128 on ssd_fwd_paired, else on the same ssd_fwd_inline variant entering from
    the pass's states), with z and without (at N 128 on the inline variants without z slots): the same bits in out and
    the final states."""
    from mamba2_aot.plans import ssd_fwd
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    inputs = _to_cuda(generators.standard_inputs(1, 2600, 8, P, N, 2, TORCH_DTYPES[io], seed=P + N, D="HP", z=z,
                                                 initial_states=True))
    assert ssd_fwd.plan_inline(8 * P // 128, 2600, N, z)[0] >= 4
    kw = dict(final=True, state_dtype=TORCH_DTYPES[state], dt_limit=(1e-3, 0.2))
    inline = _run(inputs, **kw)
    assert paired_launches == ["ssd_fwd_inline"]
    split = _run(inputs, workspace=True, **kw)
    if N == 128 and z:
        assert paired_launches[1:] == ["ssd_fwd_pass", "ssd_fwd_paired"]
        paired = {k: v for k, v in constants.items() if k != "z_gate"}
        assert paired_variants == [constants, paired]  # (the inline launch, then the split's paired segments)
    else:  # (the segments enter from the pass's states on the same variant: its prefix is empty)
        assert paired_launches[1:] == ["ssd_fwd_pass", "ssd_fwd_inline"]
        assert paired_variants == [constants, constants]
    for name, value in split.items():
        assert torch.isfinite(value.float()).all(), name
        assert torch.equal(inline[name], value), name


@ROUTES
def test_segments_after_a_pass_enter_from_its_states(z, family, constants, paired_launches, monkeypatch):
    """The segments after a states-only pass take the state entering each from the pass's chunk states (``nchunks``
    > 0), not from a walk of their own from the row's start (ssd_fwd_inline's inline pass, which would give the same
    bits: only this shows which ran): those states set to 1.0 between the two launches change the later segments'
    outputs, and not the first segment's. (Not necessarily the final states: over the last segment the entering
    state's decay may fall below their rounding.)"""
    from mamba2_aot import dispatch
    P, N, io, state = constants["headdim"], constants["d_state"], constants["io_dtype"], constants["state_dtype"]
    inputs = _to_cuda(generators.standard_inputs(1, 2600, 8, P, N, 2, TORCH_DTYPES[io], seed=P + N, D="HP", z=z,
                                                 initial_states=True))
    kw = dict(final=True, state_dtype=TORCH_DTYPES[state], workspace=True)
    plain = _run(inputs, **kw)
    assert paired_launches == ["ssd_fwd_pass", family]
    enqueue, segments = dispatch._enqueue, []

    def entering_states_set_to_one(drv, device, kernel, call, handle, packed_cache):
        enqueue(drv, device, kernel, call, handle, packed_cache)
        if call.params["states_only"]:
            (entering,) = call.outputs
            drv.memset_d32(entering.ptr, 0x3F800000, math.prod(entering.shape), handle)  # (fp32 1.0)
        else:
            segments.append(call.params["segment_len"])
    monkeypatch.setattr(dispatch, "_enqueue", entering_states_set_to_one)
    changed = _run(inputs, **kw)
    (first_len,) = segments
    assert torch.equal(changed["out"][:, :first_len], plain["out"][:, :first_len])
    assert not torch.equal(changed["out"][:, first_len:], plain["out"][:, first_len:])


def _expect_the_walks_bits(inputs, family, paired_launches, monkeypatch, **kw):
    """Run ``_run(inputs, **kw)`` (one launch) on ``family``'s kernel, then through the walk: finite, same bits."""
    from mamba2_aot.plans import ssd_fwd
    paired = _run(inputs, **kw)
    assert paired_launches == [family]
    monkeypatch.setattr(ssd_fwd, "paired_pays", lambda pairs: False)
    walk = _run(inputs, **kw)
    assert paired_launches[1:] == ["ssd_fwd"]
    for name, value in walk.items():
        assert torch.isfinite(value.float()).all(), name
        assert torch.equal(paired[name], value), name
