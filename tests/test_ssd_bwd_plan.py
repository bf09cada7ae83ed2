"""The ssd_bwd plan on the CPU: a valid call binds its launches (every kernel parameter, grids, variants, the
workspace regions); each bad input is refused with a typed error naming the argument, before anything launches."""
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors
from mamba2_aot.plans import PLANS
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (corrupt_one_argument, corruption_targets, expect_corrupted_call_refused,  # noqa: F401
                           expect_refused, expect_valid_call, fake_array, no_driver)  # (no_driver: a fixture)

MB = 1 << 20
BATCH, L, H, P, N, G = 2, 300, 8, 64, 128, 2
NBLOCKS = 5


def workspace_elements(heads=H, N=N, batch=BATCH):
    return PLANS["ssd_bwd"].workspace_size(x=fake_array(0x1000, (batch, L, heads, P), "fp16"),
                                           B=fake_array(0x1000, (batch, L, G, N), "fp16")) // 4


def bwd_args(heads=H, N=N, batch=BATCH, **over):
    """Valid fake arguments (fp16: the CAI fakes have no bf16), each array 64 MiB apart."""
    base = iter(range(0x10000000, 0x100000000, 64 * MB))
    arr = lambda shape, dtype="fp16": fake_array(next(base), shape, dtype)  # noqa: E731
    args = dict(x=arr((batch, L, heads, P)), dt=arr((batch, L, heads)), A=arr((heads,), "fp32"),
                B=arr((batch, L, G, N)), C=arr((batch, L, G, N)), D=arr((heads, P), "fp32"),
                z=arr((batch, L, heads, P)), dt_bias=arr((heads,), "fp32"),
                initial_states=arr((batch, heads, P, N), "fp32"), dt_softplus=True,
                dout=arr((batch, L, heads, P)), dfinal_states=arr((batch, heads, P, N), "fp32"),
                dx=arr((batch, L, heads, P)), ddt=arr((batch, L, heads)), dA=arr((heads,), "fp32"),
                dB=arr((batch, L, G, N)), dC=arr((batch, L, G, N)), dD=arr((heads, P), "fp32"),
                dz=arr((batch, L, heads, P)), ddt_bias=arr((heads,), "fp32"),
                dinitial_states=arr((batch, heads, P, N), "fp32"))
    args["workspace"] = fake_array(0x1_0000_0000, (workspace_elements(heads, N, batch),), "fp32")
    args.update(over)
    return args


def steps(**args):
    plan = PLANS["ssd_bwd"]
    return plan.steps(**{k: as_device_array(v, k) if k in plan.arrays and v is not None else v
                         for k, v in args.items()})


def walks_apart(call):
    """An ssd_bwd_walks call's two walks, as (recompute params, reverse-pass params) by their own names."""
    from mamba2_aot.plans.ssd_bwd import REVERSE_PREFIX
    recompute = {name: call.params[name] for name in PLANS["ssd_fwd_states"].param_names}
    reverse = {name: call.params[REVERSE_PREFIX + name] for name in PLANS["ssd_bwd_dstates"].param_names}
    return recompute, reverse


def test_valid_call_binds_its_launches():
    bound = steps(**bwd_args())
    # (16 CTAs per walk: the recompute and the reverse pass run side by side, one launch)
    assert [family for family, _ in bound] == ["ssd_bwd_walks", "ssd_bwd_chunk", "ssd_bwd_reduce"]
    for family, call in bound:
        assert set(call.params) == set(PLANS[family].param_names), family
    walks, chunk, reduce = (call for _, call in bound)
    forward, states = (types.SimpleNamespace(params=params) for params in walks_apart(walks))
    assert walks.grid == (1, H, 2 * BATCH) and walks.constants == chunk.constants
    assert forward.params["has_block_states"] == 1 and forward.params["has_chunk_states"] == 0
    assert forward.params["has_z"] == 0  # (the chunk pass computes y)
    # 20 (block, group, row) CTAs: each group's 4 heads split over 4 CTAs, and the reduce adds their dB / dC shares
    splits = H // G
    group_sum_ctas = -(-BATCH * L * G * N // 1024)
    assert chunk.params["head_splits"] == reduce.params["head_splits"] == splits
    assert chunk.grid == (NBLOCKS, G * splits, BATCH)
    assert reduce.grid == (H + group_sum_ctas, 1, 1) and reduce.params["group_sum_ctas"] == group_sum_ctas
    assert chunk.constants == {"headdim": P, "d_state": N, "io_dtype": "fp16", "state_dtype": "fp32"}
    assert chunk.params["has_z"] == 1 and chunk.params["has_dfinal_states"] == 1
    assert reduce.params["dD_per_head"] == 0 and reduce.params["has_ddt_bias"] == 1
    # the workspace regions: inside the workspace, 256-byte aligned, disjoint, and the same memory in every step
    ws = bwd_args()["workspace"]
    lo, hi = 0x1_0000_0000, 0x1_0000_0000 + workspace_elements() * 4
    regions = {"states": chunk.params["states"], "dstates": chunk.params["dstates"],
               "partials": chunk.params["partials"], "group_grads": chunk.params["group_grads"]}
    assert reduce.params["group_grads"] == regions["group_grads"]
    assert chunk.params["stride_group_grads_split"] == BATCH * L * G * N
    assert forward.params["block_states"] == regions["states"] and states.params["dstates"] == regions["dstates"]
    # the states in the I/O dtype (fp16 here), each (row, block, head)'s P × N contiguous
    assert (forward.params["stride_block_states_head"], forward.params["stride_block_states_block"],
            chunk.params["stride_states_block"]) == (P * N, H * P * N, H * P * N)
    assert regions["dstates"] - regions["states"] == -(-BATCH * NBLOCKS * H * P * N * 2 // 256) * 256
    # the reverse pass stores dstates in 16-byte vectors (its kernel assumes a 16-byte base and strides of 8 elements)
    assert all(states.params[f"stride_dstates_{dim}"] % 8 == 0 for dim in ("batch", "block", "head"))
    assert reduce.params["partials"] == regions["partials"]
    starts = sorted(regions.values())
    assert all(lo <= s < hi and s % 256 == 0 for s in starts) and len(set(starts)) == 4
    # (the recompute's y, computed only for packed sequences, goes unread into dx: no workspace for it)
    assert forward.params["out"] == chunk.params["dx"] == _ptr(bwd_args()["dx"])
    assert regions["group_grads"] + 2 * splits * BATCH * L * G * N * 4 <= hi
    assert ws is not None


@pytest.mark.parametrize("gated", [False, True])
def test_the_recompute_is_one_states_only_pass(gated):
    # (the chunk pass recomputes y for dz itself)
    (family, walks), *_ = steps(**bwd_args(**({} if gated else {"z": None, "dz": None})))
    forward, _ = walks_apart(walks)
    assert family == "ssd_bwd_walks"
    assert forward["has_block_states"] == 1 and forward["has_chunk_states"] == 0
    assert forward["segments"] == 1 and forward["seqlen"] == L and forward["has_final_states"] == 0
    assert [a.name for a in walks.outputs] == ["block_states", "dstates", "dinitial_states"]
    # packed sequences too (the walk splits blocks at sequence starts)
    packed = steps(**bwd_args(seq_idx=fake_array(0x7f000000, (BATCH, L), "int32"), initial_states=None,
                              dfinal_states=None, dinitial_states=None))
    (family, walks), *_ = packed
    forward, reverse = walks_apart(walks)
    assert family == "ssd_bwd_walks" and forward["has_seq_idx"] == reverse["has_seq_idx"] == 1
    assert forward["has_block_states"] == 1 and [a.name for a in walks.outputs] == ["block_states", "dstates"]


def test_the_walks_share_a_launch_only_when_both_fit_one_wave():
    """Side by side when the two walks' CTAs fit one wave of the walks' kernel (two per SM); a larger call keeps
    the two launches (each walk alone fills the SMs), bound exactly as the one launch's halves."""
    from mamba2_aot.plans.ssd_bwd import side_by_side, walks_side_by_side
    from mamba2_aot.plans.ssd_fwd import CTA_SLOTS
    assert walks_side_by_side((1, 64, 2)) and walks_side_by_side((1, CTA_SLOTS // 2, 1))   # B2 H64; one wave
    assert not walks_side_by_side((1, CTA_SLOTS // 2 + 1, 1)) and not walks_side_by_side((1, 80, 8))  # 2.7B: 640
    heads = CTA_SLOTS  # (BATCH rows of 264 heads: 528 CTAs per walk)
    args = bwd_args(heads)
    bound = steps(**args)
    assert [family for family, _ in bound] == ["ssd_fwd_states", "ssd_bwd_dstates", "ssd_bwd_chunk", "ssd_bwd_reduce"]
    (_, recompute), (_, reverse), *_ = bound
    assert recompute.grid == reverse.grid == (1, heads, BATCH)
    walks = side_by_side(recompute, reverse)
    assert walks.grid == (1, heads, 2 * BATCH) and set(walks.params) == set(PLANS["ssd_bwd_walks"].param_names)
    assert walks_apart(walks) == (recompute.params, reverse.params)
    assert walks.inputs == recompute.inputs + reverse.inputs and walks.outputs == recompute.outputs + reverse.outputs


def test_head_splits_only_when_too_few_ctas():
    from mamba2_aot.plans.ssd_bwd import TARGET_CTAS, head_splits
    assert head_splits(8, 64, 1, 80, 128) == 1                      # Mamba-2 2.7B, 4096 tokens: 512 CTAs already
    assert head_splits(2, 32, 1, 64, 128) == 2                      # 64 CTAs: two halves of the 64 heads
    assert head_splits(1, 1, 1, 6, 128) == 6                        # never more than the heads
    assert head_splits(1, 10, 1, 15, 128) == 15                     # the smallest divisor reaching the target: 15
    assert head_splits(1, 30, 1, 15, 128) == 5 and 30 * 5 >= TARGET_CTAS
    assert head_splits(1, 10, 1, 24, 128) == 12                     # 120 CTAs: close enough (not 240)
    assert head_splits(2, 32, 1, 64, 256) == 1                      # N 256: its two parts of N give the 128 CTAs
    assert head_splits(1, 10, 1, 24, 256) == 6                      # 20 (block, part) CTAs x 6 = 120


@pytest.mark.parametrize("H,G,N,batch", [(24, 1, 128, 1), (23, 1, 64, 1), (64, 1, 128, 2), (16, 8, 64, 3),
                                         (24, 1, 256, 1), (64, 2, 256, 2)])
def test_workspace_sized_for_a_call_serves_every_smaller_call(H, G, N, batch):
    """Head splits shrink as a call grows, so the dB / dC shares alone could need more at a shorter L: the size
    must not decrease with L or batch."""
    from mamba2_aot.plans.ssd_bwd import Workspace
    sizes = [Workspace(batch, L, H, 64, G, N, "bf16").size for L in range(1, 1500, 7)]
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    by_batch = [Workspace(b, 300, H, 64, G, N, "bf16").size for b in range(1, 12)]
    assert all(a <= b for a, b in zip(by_batch, by_batch[1:]))
    for L in (638, 645, 1000):
        ws = Workspace(batch, L, H, 64, G, N, "bf16")
        if "group_grads" in ws.offsets:  # this call's shares fit in the region
            assert ws.offsets["group_grads"] + 2 * ws.head_splits * batch * L * G * N * 4 <= ws.size


def test_group_and_share_sum_sizes_match_the_kernels():
    from kernel_src.families import kernel_class
    from mamba2_aot.plans.ssd_bwd import GROUP_SUM_ELEMENTS, SHARE_SUM_ELEMENTS, WALKS_D_STATES, d_state_splits
    assert kernel_class("ssd_bwd_walks").d_states == WALKS_D_STATES
    assert kernel_class("ssd_bwd_reduce").group_sum_elements == GROUP_SUM_ELEMENTS
    assert kernel_class("ssd_bwd_reduce").share_sum_elements == SHARE_SUM_ELEMENTS
    for d_state in (64, 128, 256):
        assert kernel_class("ssd_bwd_chunk")(64, d_state, "bf16", "fp32").d_state_splits == d_state_splits(d_state)


@pytest.mark.parametrize("gated", [True, False])
def test_d_state_256_is_split_over_two_ctas_whose_shares_the_reduce_adds(gated):
    """N 256: each group's columns of N go to two ssd_bwd_chunk CTAs (grid z: rows x parts), which write fp32 shares
    of dx, dz and ddt into the workspace (rows (row, part)) for ssd_bwd_reduce to add into the caller's dx, dz and
    ddt; no ssd_bwd_walks launch at N 256."""
    args = bwd_args(N=256, **({} if gated else {"z": None, "dz": None}))
    bound = steps(**args)
    assert [family for family, _ in bound] == ["ssd_fwd_states", "ssd_bwd_dstates", "ssd_bwd_chunk", "ssd_bwd_reduce"]
    (_, recompute), _, (_, chunk), (_, reduce) = bound
    for family, call in bound:
        assert set(call.params) == set(PLANS[family].param_names), family
    splits = chunk.params["head_splits"]
    assert splits == reduce.params["head_splits"] == H // G   # (40 CTAs: the heads split too)
    assert chunk.grid == (NBLOCKS, G * splits, 2 * BATCH) and chunk.constants["d_state"] == 256
    from mamba2_aot.plans.ssd_bwd import GROUP_SUM_ELEMENTS, SHARE_SUM_ELEMENTS
    share_sum_ctas = -(-BATCH * L * H * P // SHARE_SUM_ELEMENTS)
    group_sum_ctas = -(-BATCH * L * G * 256 // GROUP_SUM_ELEMENTS)
    assert reduce.params["d_state_splits"] == 2 and reduce.params["share_sum_ctas"] == share_sum_ctas
    assert reduce.grid == (H + group_sum_ctas + share_sum_ctas, 1, 1)
    lo, hi = 0x1_0000_0000, 0x1_0000_0000 + workspace_elements(N=256) * 4
    grads = ("dx", "ddt") + (("dz",) if gated else ())
    for name in grads:
        share = chunk.params[name]
        assert share == reduce.params[f"{name}_shares"] and lo <= share < hi and share % 256 == 0
        assert reduce.params[name] == _ptr(args[name])
        assert chunk.params[f"stride_{name}_batch"] == reduce.params[f"stride_{name}_shares_batch"] == L * H * (
            P if name != "ddt" else 1)
    assert reduce.params["has_z"] == int(gated)
    if not gated:
        assert chunk.params["dz"] == reduce.params["dz_shares"] == reduce.params["dz"] == 0
    # the chunk pass writes the shares (named for the gradients they are shares of), the reduce the gradients
    assert all(a.ptr != _ptr(args[a.name]) for a in chunk.outputs if a.name in grads)
    assert {a.name for a in reduce.outputs} >= set(grads)
    # the partials' rows are (row, part of N) too
    assert chunk.params["stride_partials_batch"] == NBLOCKS * H * (P + 2)
    assert recompute.constants["d_state"] == 256


def test_d_state_256_doubles_the_chunk_grid_z_and_checks_it(monkeypatch):
    """The chunk pass's grid z is batch × parts of N: refused (before any launch) when that, not batch alone, exceeds
    the grid's limit."""
    from mamba2_aot.plans import ssd_bwd
    monkeypatch.setattr(ssd_bwd, "GRID_YZ_MAX", 2 * BATCH - 1)
    steps(**bwd_args())  # (N 128: grid z = batch)
    with pytest.raises(errors.ShapeError) as info:
        steps(**bwd_args(N=256))
    assert info.value.argument == "x" and "grid z" in str(info.value)


def test_no_head_splits_no_group_grads():
    """64 rows x 5 blocks x 2 groups: 640 CTAs, so each CTA takes its group's heads and writes dB / dC itself."""
    big = 64
    base = iter(range(0x10000000, 0x10000000000, 1 << 32))
    arr = lambda shape, dtype="fp16": fake_array(next(base), shape, dtype)  # noqa: E731
    args = dict(x=arr((big, L, H, P)), dt=arr((big, L, H)), A=arr((H,), "fp32"), B=arr((big, L, G, N)),
                C=arr((big, L, G, N)), dout=arr((big, L, H, P)), dx=arr((big, L, H, P)), ddt=arr((big, L, H)),
                dA=arr((H,), "fp32"), dB=arr((big, L, G, N)), dC=arr((big, L, G, N)))
    size = PLANS["ssd_bwd"].workspace_size(x=args["x"], B=args["B"])
    *_, (_, chunk), (_, reduce) = steps(**args, workspace=arr((size // 4,), "fp32"))
    assert chunk.params["head_splits"] == 1 and chunk.params["group_grads"] == 0
    assert chunk.params["stride_group_grads_split"] == 0
    assert chunk.grid == (NBLOCKS, G, big) and reduce.grid == (H, 1, 1) and reduce.params["group_sum_ctas"] == 0


def test_per_head_D_and_no_optional_gradients():
    args = bwd_args(D=fake_array(0x7f000000, (H,), "fp32"), dD=fake_array(0x7e000000, (H,), "fp32"))
    for name in ("z", "dz", "dt_bias", "ddt_bias", "dfinal_states", "dinitial_states", "initial_states"):
        args.pop(name)
    *_, (_, chunk), (_, reduce) = steps(**args)
    assert reduce.params["dD_per_head"] == 1 and reduce.params["stride_dD_dim"] == 0
    assert chunk.params["has_z"] == 0 and chunk.params["dz"] == 0 and chunk.params["has_dfinal_states"] == 0


@pytest.mark.parametrize("over,error,argument,fragment", [
    ({"dz": None}, errors.InvalidArgumentError, "dz", "required when z is given"),
    ({"z": None}, errors.InvalidArgumentError, "dz", "given without z"),
    ({"dD": fake_array(0x7f000000, (H,), "fp32")}, errors.ShapeError, "dD", "the shape of D"),
    ({"dout": fake_array(0x7f000000, (BATCH, L, H, P), "fp32")}, errors.DTypeError, "dout", "fp16"),
    ({"dB": fake_array(0x7f000000, (BATCH, L, 1, N), "fp16")}, errors.ShapeError, "dB", "the shape of B"),
    ({"workspace": fake_array(0x7f000000, (1000,), "fp32")}, errors.ShapeError, "workspace", "workspace_size"),
    ({"dinitial_states": fake_array(0x7f000000, (BATCH, H, P, N), "fp16")}, errors.DTypeError, "dinitial_states",
     "fp32"),
    ({"dfinal_states": fake_array(0x7f000000, (3, H, P, N), "fp32")}, errors.ShapeError, "dfinal_states",
     "num_seqs"),
    # dx and dz are written in 16-byte row vectors
    ({"dx": fake_array(0x7f000008, (BATCH, L, H, P), "fp16")}, errors.AlignmentError, "dx", "16-byte aligned"),
    ({"dz": fake_array(0x7f000008, (BATCH, L, H, P), "fp16")}, errors.AlignmentError, "dz", "16-byte aligned"),
    ({"dx": fake_array(0x7f000000, (BATCH, L, H, P), "fp16", strides=(L * H * 68, H * 68, 68, 1))},
     errors.StrideError, "dx", "multiples of 8"),
    ({"dx": fake_array(0x7f000000, (BATCH, L, H, P), "fp16", strides=(L * H * P * 2, H * P * 2, P * 2, 2))},
     errors.StrideError, "dx", "last dim must be contiguous"),   # (was named out, the forward's name for dx)
    # a wrong z is z's error, not dz's (whose shape follows z)
    ({"z": fake_array(0x7f000000, (BATCH, L, H, P + 8), "fp16")}, errors.ShapeError, "z", "of x"),
])
def test_bad_input_is_refused_before_anything_launches(no_driver, over, error, argument, fragment):
    expect_refused("ssd_bwd", bwd_args(**over), error, argument, fragment)


@pytest.mark.parametrize("N", [128, 256])   # (256: d_state in two parts, whose shares ssd_bwd_reduce adds)
@pytest.mark.parametrize("D_shape", [(H,), (H, P)])
def test_an_empty_batch_launches_only_the_sums_which_write_zero_da_dd_ddt_bias(stub_launches, N, D_shape):
    from mamba2_aot import dispatch
    _, log = stub_launches
    args = lambda: bwd_args(batch=0, N=N, D=fake_array(0x7000_0000, D_shape, "fp32"),  # noqa: E731
                            dD=fake_array(0x7100_0000, D_shape, "fp32"))
    bound = steps(**args())
    assert [call.grid for _, call in bound if 0 not in call.grid] == [(H, 1, 1)]   # no group or share sums
    family, reduce = bound[-1]
    assert family == "ssd_bwd_reduce" and reduce.params["batch"] == 0   # the head sums loop over no rows: zero
    assert {a.name for a in reduce.outputs} >= {"dA", "dD", "ddt_bias"}
    dispatch.launch("ssd_bwd", stream=0, **args())
    assert log == ["ssd_bwd_reduce"]


def test_no_heads_is_refused_before_anything_launches(stub_launches):
    from mamba2_aot import dispatch
    _, log = stub_launches
    with pytest.raises(errors.ShapeError, match="needs nheads >= 1") as info:
        dispatch.launch("ssd_bwd", stream=0, **bwd_args(heads=0))
    assert info.value.argument == "x" and log == []


def test_a_step_cannot_be_launched_alone(no_driver):
    expect_refused("ssd_bwd_chunk", {}, errors.InvalidArgumentError, "family", "launch('ssd_bwd', ...)")


def test_unknown_keyword_lists_the_accepted_ones(no_driver):
    expect_refused("ssd_bwd", bwd_args(d_x=1), errors.InvalidArgumentError, "d_x", "ssd_bwd accepts: x, dt")


@pytest.mark.parametrize("over,argument", [
    (lambda a: {"dinitial_states": a["initial_states"]}, "dinitial_states"),   # written by step 2, read by step 3
    (lambda a: {"dA": fake_array(_ptr(a["dx"]), (H,), "fp32")}, "dA"),         # step 4 would clobber step 3's dx
    (lambda a: {"dout": fake_array(_ptr(a["workspace"]), (BATCH, L, H, P), "fp16")}, "workspace"),  # y over dout
    (lambda a: {"dD": a["D"]}, "dD"),
])
def test_overlaps_across_the_steps_are_refused(no_driver, over, argument):
    args = bwd_args()
    args.update(over(args))
    expect_refused("ssd_bwd", args, errors.AliasingError, argument, "overlaps")


def _ptr(fake):
    return fake.__cuda_array_interface__["data"][0]


def test_a_read_only_or_misaligned_workspace_is_refused(no_driver):
    n = workspace_elements()
    ro = fake_array(0x1_0000_0000, (n,), "fp32")
    ro.__cuda_array_interface__["data"] = (0x1_0000_0000, True)
    expect_refused("ssd_bwd", bwd_args(workspace=ro), errors.InvalidArgumentError, "workspace", "read-only")
    expect_refused("ssd_bwd", bwd_args(workspace=fake_array(0x1_0000_0004, (n,), "fp32")), errors.AlignmentError,
                   "workspace", "16-byte aligned")


def test_workspace_size_names_a_missing_argument():
    with pytest.raises(errors.InvalidArgumentError) as info:
        PLANS["ssd_bwd"].workspace_size(x=fake_array(0x1000, (BATCH, L, H, P), "fp16"))
    assert info.value.argument == "B"


class _StubKernel:
    def __init__(self, family, log):
        self.family, self.log = family, log

    def launch(self, drv, call, stream, cache):
        self.log.append(self.family)


@pytest.fixture
def stub_launches(monkeypatch):
    """A FakeDriver device, every variant 'built', kernels that only record their launch."""
    from mamba2_aot import dispatch, driver, manifest
    from runtime_fakes import FakeDriver, reset_runtime_state
    reset_runtime_state(monkeypatch)
    fake = FakeDriver()
    monkeypatch.setattr(driver, "_driver", fake)

    class Catalog:
        def require_built(self, family, key):
            pass
    monkeypatch.setattr(manifest, "catalog", lambda: Catalog())
    log = []

    def load(drv, plan, constants, device, *, capture_stream=None):
        if capture_stream is not None and drv.stream_is_capturing(capture_stream) and plan.family != "ssd_bwd_walks":
            raise errors.GraphCaptureError(f"{plan.family} is not loaded")
        return _StubKernel(plan.family, log)
    monkeypatch.setattr(dispatch, "load_kernel", load)
    return fake, log


def test_steps_launch_in_order(stub_launches):
    from mamba2_aot import dispatch
    _, log = stub_launches
    dispatch.launch("ssd_bwd", stream=0, **bwd_args())
    assert log == ["ssd_bwd_walks", "ssd_bwd_chunk", "ssd_bwd_reduce"]


def test_device_and_load_errors_come_before_any_launch(stub_launches):
    from mamba2_aot import dispatch
    fake, log = stub_launches
    with pytest.raises(errors.DeviceError) as info:  # dA on another device than the rest
        dispatch.launch("ssd_bwd", stream=0, **bwd_args(dA=fake_array(1 << 41, (H,), "fp32")))
    assert info.value.argument == "dA" and log == []
    fake.capturing = True
    with pytest.raises(errors.GraphCaptureError):   # a step not loaded while the stream captures
        dispatch.launch("ssd_bwd", stream=0x1234, **bwd_args())
    assert log == []


OPTIONAL_PAIRS = (("z", "dz"), ("D", "dD"), ("dt_bias", "ddt_bias"), ("initial_states",), ("dfinal_states",),
                  ("dinitial_states",))
OUTPUTS = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states", "workspace")
# (initial states may be in fp32, bf16 or fp16, a pool's dtypes; a workspace may be larger than it needs; x, z, B,
# C, dout, dx, dz and the workspace move 16 bytes at a time; the states and their gradients are headdim × d_state
# blocks; the kernels take any stride along the last dim of the per-head vectors and of dt, ddt)
EXEMPT = dict(free_dims={"workspace": {0}}, vectors=("x", "z", "B", "C", "dout", "dx", "dz", "workspace"),
              blocks=("initial_states", "dfinal_states", "dinitial_states"),
              free_last_stride=("A", "D", "dA", "dD", "dt", "ddt", "dt_bias", "ddt_bias"))


@pytest.mark.parametrize("target", corruption_targets([bwd_args(batch=1)], OUTPUTS, **EXEMPT,
                                                      least_elements={"workspace": workspace_elements(batch=1)}),
                         ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid call (options drawn, batch 0 included) with one array made wrong (each argument, each way): a typed
    refusal naming one of the call's arguments (the one made wrong, where nothing else can be), and the driver never
    opened."""
    batch = data.draw(st.sampled_from([0, 1, 2]), label="batch")
    args = bwd_args(batch=batch)
    for names in OPTIONAL_PAIRS:
        if target[0] not in names and data.draw(st.booleans(), label=f"drop {names}"):
            for name in names:
                del args[name]
    expect_valid_call("ssd_bwd", args)
    aliased = corrupt_one_argument(data, args, OUTPUTS, target, dtypes={"initial_states": {"<f2"}},
                                   least_elements={"workspace": workspace_elements(batch=batch)}, **EXEMPT)
    expect_corrupted_call_refused("ssd_bwd", args, target, aliased)
