"""The ssd_fwd launch plan on the CPU: a valid call binds every kernel parameter with the right grid and
variant; each bad input is refused with a typed error naming the argument, before the driver is touched."""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors, runtime
from mamba2_aot.plans import PLANS
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (FakeCAI, contiguous, corrupt_one_argument, corruption_targets,  # noqa: F401  (fixtures)
                           expect_corrupted_call_refused, expect_refused, expect_valid_call, fake_array,
                           fake_runtime, no_driver)

MB = 1 << 20
BATCH, L, H, P, N, G = 2, 300, 8, 64, 128, 2


def ssd_args(**over):
    """Valid fake arguments (fp16 activations: the CAI fakes have no bf16), each array 64 MiB apart."""
    base = iter(range(0x10000000, 0x80000000, 64 * MB))
    arr = lambda shape, dtype="fp16", strides=None: fake_array(next(base), shape, dtype, strides)  # noqa: E731
    args = dict(x=arr((BATCH, L, H, P)), dt=arr((BATCH, L, H)), A=arr((H,), "fp32"), B=arr((BATCH, L, G, N)),
                C=arr((BATCH, L, G, N)), out=arr((BATCH, L, H, P)), D=arr((H,), "fp32"), z=arr((BATCH, L, H, P)),
                dt_bias=arr((H,), "fp32"), initial_states=arr((BATCH, H, P, N), "fp32"),
                final_states=arr((BATCH, H, P, N), "fp32"), chunk_states=arr((BATCH, 3, H, P, N), "fp32"),
                chunk_size=128, dt_softplus=True)
    args.update(over)
    return args


def adapted(**args):
    """The arguments as the dispatcher hands them to the plan (arrays as DeviceArray records)."""
    return {k: as_device_array(v, k) if k in PLANS["ssd_fwd"].arrays and v is not None else v for k, v in args.items()}


def bind(**args):
    return PLANS["ssd_fwd"].bind(**adapted(**args))


def test_valid_call_binds_every_parameter():
    call = bind(**ssd_args())
    # (and inline_pass, the plan's own: which launches ssd_fwd_inline runs)
    assert set(call.params) == set(PLANS["ssd_fwd"].param_names) | {"inline_pass"}
    assert call.grid == (P // 64, H, BATCH)
    assert call.constants == {"headdim": P, "d_state": N, "io_dtype": "fp16", "state_dtype": "fp32"}
    assert call.params["nchunks"] == 3 and call.params["num_seqs"] == BATCH
    assert call.params["stride_D_dim"] == 0 and call.params["has_chunk_states"] == 1


def test_cu_seqlens_launches_one_cta_row_per_sequence():
    cu = fake_array(0x7f000000, (5,), "int32")
    one = {"x": fake_array(0x20000000, (1, L, H, P), "fp16"), "dt": fake_array(0x24000000, (1, L, H), "fp16"),
           "B": fake_array(0x28000000, (1, L, G, N), "fp16"), "C": fake_array(0x2c000000, (1, L, G, N), "fp16"),
           "out": fake_array(0x30000000, (1, L, H, P), "fp16"), "z": fake_array(0x34000000, (1, L, H, P), "fp16")}
    call = bind(**ssd_args(**one, cu_seqlens=cu, initial_states=fake_array(0x7e000000, (4, H, P, N), "fp32"),
                           final_states=fake_array(0x7d000000, (4, H, P, N), "fp32"),
                           chunk_states=fake_array(0x7c000000, (1, 3, H, P, N), "fp32")))
    assert call.grid == (1, H, 4) and call.params["num_seqs"] == 4 and call.params["has_cu_seqlens"] == 1


def test_pool_in_place_is_not_an_aliasing_error():
    pool = fake_array(0x7f000000, (10, H, P, N), "fp16")
    idx = fake_array(0x7e000000, (BATCH,), "int32")
    call = bind(**ssd_args(initial_states=pool, final_states=pool, initial_state_indices=idx,
                           final_state_indices=idx))
    assert call.constants["state_dtype"] == "fp16" and call.params["num_final_slots"] == 10
    assert all(a.name != "initial_states" for a in call.inputs)  # read and written: an output only


SLICED = fake_array(0x70000000, (BATCH, L, H, P), "fp16", strides=(L * H * P * 2, H * P * 2, P + 4, 1))
BAD = [
    ({"chunk_size": 100}, errors.InvalidArgumentError, "chunk_size", "expected one of (64, 128, 256)"),
    ({"x": fake_array(0x70000000, (BATCH, L, H, P), "fp32")}, errors.DTypeError, "x", "bf16 or fp16"),
    ({"x": fake_array(0x70000000, (BATCH, L, H, 48), "fp16")}, errors.ShapeError, "x", "multiple of 64"),
    ({"x": fake_array(0x70000002, (BATCH, L, H, P), "fp16")}, errors.AlignmentError, "x", "16-byte aligned"),
    ({"x": SLICED}, errors.StrideError, "x", "multiples of 8"),
    ({"z": fake_array(0x70000008, (BATCH, L, H, P), "fp16")}, errors.AlignmentError, "z", "16-byte aligned"),
    ({"out": fake_array(0x70000000, (BATCH, L, H, P), "fp16", strides=(L * H * P * 2, H * P * 2, P + 4, 1))},
     errors.StrideError, "out", "multiples of 8"),
    ({"B": fake_array(0x70000000, (BATCH, L, 3, N))}, errors.ShapeError, "B", "must divide nheads"),
    ({"dt": fake_array(0x70000000, (BATCH, L, H), "fp32")}, errors.DTypeError, "dt", "expected dtype fp16"),
    ({"initial_states": fake_array(0x70000000, (BATCH, H, P, N), "fp16")}, errors.InvalidArgumentError,
     "final_states", "differs from initial_states"),
    ({"final_states": fake_array(0x70000000, (BATCH, H, P, N), "fp32", strides=(H * P * N, P * N, 1, P))},
     errors.StrideError, "final_states", "contiguous headdim"),
    ({"chunk_states": fake_array(0x70000000, (BATCH, 2, H, P, N), "fp32")}, errors.ShapeError, "chunk_states",
     "ceil(seqlen / chunk_size)"),
    ({"chunk_states": fake_array(0x70000004, (BATCH, 3, H, P, N), "fp32")}, errors.AlignmentError, "chunk_states",
     "8-byte aligned"),
    ({"chunk_states": fake_array(0x70000000, (BATCH, 3, H, P, N), "fp32",
                                 strides=(3 * H * (P * N + 1), H * (P * N + 1), P * N + 1, N, 1))},
     errors.StrideError, "chunk_states", "must be even"),
    ({"seq_idx": fake_array(0x70000000, (BATCH, L), "int32")}, errors.ShapeError, "x",
     "per-sequence states with seq_idx need batch == 1"),
    ({"cu_seqlens": fake_array(0x70000000, (3,), "int32")}, errors.ShapeError, "x", "needs batch == 1"),
    ({"seq_idx": fake_array(0x70000000, (1, L), "int32"), "cu_seqlens": fake_array(0x74000000, (3,), "int32")},
     errors.InvalidArgumentError, "seq_idx", "not both"),
    ({"initial_state_indices": fake_array(0x70000000, (BATCH,), "int32"), "initial_states": None},
     errors.InvalidArgumentError, "initial_state_indices", "given without initial_states"),
    ({"D": fake_array(0x70000000, (H, P + 1), "fp32")}, errors.ShapeError, "D", "(nheads,) or (nheads, headdim)"),
    ({"D": fake_array(0x70000000, (P,), "fp32")}, errors.ShapeError, "D", f"expected shape ({H},) (nheads,) or"),
    ({"out": fake_array(0x10000000, (BATCH, L, H, P), "fp16")}, errors.AliasingError, "out", "overlaps x"),
]


@pytest.mark.parametrize("change,error,argument,fragment", BAD)
def test_refused_calls_name_the_argument_and_never_reach_the_driver(no_driver, change, error, argument, fragment):  # noqa: F811
    expect_refused("ssd_fwd", ssd_args(**change), error, argument, fragment)


def test_workspace_is_zero_when_the_call_fills_the_gpu():
    assert runtime.workspace_size("ssd_fwd", **ssd_args()) == 0  # 16 CTAs but L 300: too short to split


def long_args(batch=1, seqlen=4096, heads=64, d_state=N, gated=False, **over):
    """A call with few CTAs (batch x heads) over a long L: split along L. With z when ``gated``."""
    base = iter(range(1 << 32, 1 << 40, 1 << 32))
    arr = lambda shape, dtype="fp16": fake_array(next(base), shape, dtype)  # noqa: E731
    args = dict(x=arr((batch, seqlen, heads, P)), dt=arr((batch, seqlen, heads)), A=arr((heads,), "fp32"),
                B=arr((batch, seqlen, 1, d_state)), C=arr((batch, seqlen, 1, d_state)),
                out=arr((batch, seqlen, heads, P)), final_states=arr((batch, heads, P, d_state), "fp32"),
                workspace=arr((1 << 26,), "fp32"), chunk_size=256)
    if gated:
        args["z"] = arr((batch, seqlen, heads, P))
    args.update(over)
    return args


def launches(**args):
    """The plan's (family, call) launches of a call."""
    return PLANS["ssd_fwd"].steps(**adapted(**args))


def steps(**args):
    return [call for _, call in launches(**args)]


def families(**args):
    return [family for family, _ in launches(**args)]


def test_a_call_with_few_ctas_is_split_into_a_states_pass_and_segments():
    # 128 CTAs: two segments fill the 264 slots; a pass of 4096 tokens, too long for an inline pass with a workspace
    args = long_args(heads=128, seqlen=8192)
    first, second = steps(**args)
    ws = args["workspace"].__cuda_array_interface__["data"][0]
    per_segment = 128 * P * N  # fp32 elements of the entering states per segment: batch x heads x P x N
    assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"]) == per_segment * 4
    # the states-only pass walks the first segment, leaving its end state in the workspace as a "chunk state"
    assert first.grid == (1, 128, 1)
    assert {k: first.params[k] for k in ("states_only", "segments", "seqlen", "chunk_size", "nchunks",
                                         "has_chunk_states", "chunk_states", "has_final_states")} == {
        "states_only": 1, "segments": 1, "seqlen": 4096, "chunk_size": 4096, "nchunks": 1, "has_chunk_states": 1,
        "chunk_states": ws, "has_final_states": 0}
    assert [a.name for a in first.outputs] == ["workspace"] and first.outputs[0].shape == (1, 1, 128, P, N)
    assert first.params["stride_chunk_states_chunk"] == per_segment
    # then both segments at once, each from its entering state; the call's own outputs as unsplit
    assert second.grid == (1, 128, 2)
    assert {k: second.params[k] for k in ("states_only", "segments", "segment_len", "seqlen", "has_chunk_states",
                                          "chunk_states", "chunk_size", "has_final_states")} == {
        "states_only": 0, "segments": 2, "segment_len": 4096, "seqlen": 8192, "has_chunk_states": 0,
        "chunk_states": ws, "chunk_size": 4096, "has_final_states": 1}
    assert [a.name for a in second.outputs] == ["out", "final_states"] and second.inputs[-1].name == "workspace"


def test_segments_fill_the_free_slots_and_fit_the_workspace():
    # 32 CTAs: 8 fit in the 264 slots; a workspace for 3 entering states allows 4 segments
    first, second = steps(**long_args(heads=32))
    assert second.params["segments"] == 8 and second.params["segment_len"] == 512 and first.params["seqlen"] == 3584
    small = fake_array(1 << 40, (3 * 32 * P * N,), "fp32")
    first, second = steps(**long_args(heads=32, workspace=small))
    assert second.params["segments"] == 4 and second.params["segment_len"] == 1024 and first.params["seqlen"] == 3072
    # without a workspace, one launch with an inline pass (test_a_call_without_a_workspace_...)
    assert [call.params["inline_pass"] for call in steps(**long_args(heads=32, workspace=None))] == [1]


def test_a_split_calls_rows_go_in_grid_x_after_the_slices_of_p():
    """Segments run segment-major: grid (P / 64 * rows, heads, segments), every first segment before any second."""
    first, second = steps(**long_args(batch=2, heads=32))
    assert first.grid == (1, 32, 2) and second.grid == (2, 32, second.params["segments"])


def test_chunk_states_hold_the_entering_states_without_a_workspace():
    chunks = fake_array(1 << 41, (1, 16, 64, P, N), "fp32")
    first, second = steps(**long_args(workspace=None, chunk_states=chunks))
    assert first.params["chunk_size"] == second.params["chunk_size"] == 256  # the call's own chunks
    assert first.params["chunk_states"] == second.params["chunk_states"] == 1 << 41
    assert second.params["segment_len"] % 256 == 0 and second.params["has_chunk_states"] == 1
    assert first.outputs[0].name == "chunk_states"


def test_a_split_that_would_not_pay_is_not_taken():
    """Segments are multiples of the chunk size when chunk_states hold the entering states: L 513 with Q 256 would
    be 512 tokens of states-only pass for a 1-token last segment; L 2048 is split in two, as the cost model says."""
    from mamba2_aot.plans.ssd_fwd import plan_segments
    assert plan_segments(1, 513, 64, 64, 128, 256) == (1, 513)
    assert plan_segments(1, 800, 64, 64, 128, 256) == (1, 800)
    assert plan_segments(1, 2048, 128, 64, 128, 256) == (2, 1024)
    assert plan_segments(1, 4096, 64, 64, 128) == (4, 1024)  # 64 CTAs: four segments fill the 264 slots


def test_a_call_over_a_wave_hands_its_segments_states_over_in_one_launch():
    """The 2.7B shape (640 CTAs for 264 slots: the third wave 42 % full) runs as two segments per row in one launch,
    segment-major (grid z = segment, x = row), the first segment's end state a segment-long chunk state in the
    workspace, then one flag per CTA of the first segment, which the runtime zeroes before the launch."""
    from mamba2_aot.plans.ssd_fwd import plan_handover
    assert plan_handover(8, 4096, 80, 64, 128) == (2, 2048)
    args = long_args(batch=8, heads=80)
    ws = args["workspace"].__cuda_array_interface__["data"][0]
    state_bytes = 8 * 80 * P * N * 4  # batch x (segments - 1) x heads x P x N fp32
    assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"]) == state_bytes + 640 * 4
    (call,) = steps(**args)
    assert call.grid == (8, 80, 2)
    assert {k: call.params[k] for k in ("states_only", "segments", "segment_len", "has_chunk_states", "chunk_states",
                                        "chunk_size", "nchunks", "has_segment_flags", "segment_flags")} == {
        "states_only": 0, "segments": 2, "segment_len": 2048, "has_chunk_states": 1, "chunk_states": ws,
        "chunk_size": 2048, "nchunks": 1, "has_segment_flags": 1, "segment_flags": ws + state_bytes}
    assert call.params["stride_chunk_states_chunk"] == 80 * P * N
    assert [a.name for a in call.outputs] == ["out", "final_states", "workspace", "workspace"]
    assert call.outputs[2].shape == (8, 1, 80, P, N)
    (flags,) = call.zeroed
    assert flags.ptr == ws + state_bytes and flags.shape == (640,) and flags.dtype == "int32"


@pytest.mark.parametrize("shape,expected", [
    ((8, 4096, 80, 64, 128), (2, 2048)),   # 2.42 waves: five half-rows
    ((8, 4096, 66, 64, 128), (1, 4096)),   # exactly two waves
    ((4, 4096, 80, 64, 128), (4, 1024)),   # 1.21 waves: five quarter-rows
    ((8, 400, 80, 64, 128), (1, 400)),     # segments of 256 and 144 tokens: no shorter waves
    ((2, 4096, 64, 64, 128), (1, 4096)),   # one wave: a states-only split's case
    ((8, 4096, 20, 64, 256), (4, 1024)),   # d_state 256: 132 slots, 160 CTAs
])
def test_handover_segments_shorten_the_waves(shape, expected):
    from mamba2_aot.plans.ssd_fwd import plan_handover
    assert plan_handover(*shape) == expected


def test_a_handover_needs_its_whole_workspace_and_no_chunk_states():
    """Without room for every segment's state and the flags, or with chunk_states asked for, the call is not split."""
    args = long_args(batch=8, heads=80)
    need = runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"])
    for over in ({"workspace": fake_array(1 << 40, (need // 4 - 1,), "fp32")}, {"workspace": None},
                 {"chunk_states": fake_array(1 << 41, (8, 16, 80, P, N), "fp32")}):
        (call,) = steps(**long_args(batch=8, heads=80, **over))
        assert call.params["segments"] == 1 and call.params["has_segment_flags"] == 0 and call.zeroed == (), over


def _cumsum_zeroing(monkeypatch, zeroed):
    """ssd_chunk_cumsum's plan, its calls also asking to have ``zeroed`` (a DeviceArray) zeroed as an output."""
    from mamba2_aot.plans.ssd_chunk_cumsum import ChunkCumsumPlan
    bind_cumsum = ChunkCumsumPlan.bind
    monkeypatch.setattr(ChunkCumsumPlan, "bind", lambda self, **kw: (lambda c: c._replace(
        outputs=c.outputs + (zeroed,), zeroed=(zeroed,)))(bind_cumsum(self, **kw)))
    return {"dt": fake_array(0x10000000, (2, 300, 4), "fp32"), "A": fake_array(0x10100000, (4,), "fp32"),
            "dt_out": fake_array(0x10200000, (2, 4, 5, 64), "fp32"),
            "dA_cumsum": fake_array(0x10300000, (2, 4, 5, 64), "fp32"), "chunk_size": 64}


def test_zeroed_arrays_are_cleared_on_the_stream_before_the_launch(fake_runtime, monkeypatch):  # noqa: F811
    """A bound call's ``zeroed`` arrays (a handover's flags) are set to zero on the launch's stream just before the
    kernel, on every call (a memoised call too)."""
    args = _cumsum_zeroing(monkeypatch, as_device_array(fake_array(0x10500000, (96,), "int32"), "flags"))
    launched = []
    monkeypatch.setattr(fake_runtime, "launch", lambda *a: launched.append(
        [c for c in fake_runtime.calls if c[0] == "memset_d32"]))
    for _ in range(2):
        runtime.launch("ssd_chunk_cumsum", stream=0x5000, **args)
    memset = ("memset_d32", 0x10500000, 0, 96, 0x5000)
    assert launched == [[memset], [memset, memset]]


def test_a_zeroed_array_must_be_contiguous_32_bit_words(fake_runtime, monkeypatch):  # noqa: F811
    args = _cumsum_zeroing(monkeypatch, as_device_array(fake_array(0x10500000, (96,), "int32", (2,)), "flags"))
    with pytest.raises(RuntimeError, match="a plan bug"):
        runtime.launch("ssd_chunk_cumsum", stream=0x5000, **args)
    assert fake_runtime.launches == []


def test_workspace_size_is_zero_for_calls_that_are_never_split():
    args = long_args(heads=128, seqlen=8192)
    assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"]) > 0
    pool = fake_array(1 << 42, (8, 128, P, N), "fp32")
    for extra in ({"seq_idx": fake_array(1 << 42, (1, 8192), "int32")},
                  {"cu_seqlens": fake_array(1 << 42, (3,), "int32")},
                  {"chunk_states": fake_array(1 << 41, (1, 32, 128, P, N), "fp32")},
                  {"initial_states": pool, "final_states": pool},
                  {"initial_states": pool, "final_states": fake_array(1 << 42, (8, 128, P, N), "fp32")}):  # (a twin)
        assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"], **extra) == 0, extra


@pytest.mark.parametrize("batch,heads", [(0, 64), (1, 0), (0, 0)])
def test_an_empty_call_launches_nothing_with_or_without_a_workspace(no_driver, batch, heads):  # noqa: F811
    args = long_args(batch=batch, heads=heads)
    assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"]) == 0
    for with_workspace in (True, False):
        if not with_workspace:
            del args["workspace"]
        assert [0 in call.grid for call in steps(**args)] == [True]
        runtime.launch("ssd_fwd", **args)   # (no_driver: opening the driver fails the test)


@pytest.mark.parametrize("x,B,error,argument,fragment", [
    ((BATCH, L, H, P, "fp32"), (BATCH, L, G, N, "fp16"), errors.DTypeError, "x", "bf16 or fp16"),
    ((BATCH, L, H, 48, "fp16"), (BATCH, L, G, N, "fp16"), errors.ShapeError, "x", "multiple of 64"),
    ((BATCH, 0, H, P, "fp16"), (BATCH, 0, G, N, "fp16"), errors.ShapeError, "x", "seqlen (dim 1) must be >= 1"),
    ((BATCH, L, H, P, "fp16"), (BATCH, L, 3, N, "fp16"), errors.ShapeError, "B", "must divide nheads"),
    ((BATCH, L, H, P, "fp16"), (7, 3, G, N, "fp16"), errors.ShapeError, "B", "of x"),
    ((BATCH, L, H, P, "fp16"), (BATCH, L, G, N, "fp32"), errors.DTypeError, "B", "fp16"),
    ((BATCH, L, H, 0, "fp16"), (BATCH, L, G, N, "fp16"), errors.ShapeError, "x", "positive multiple of 64"),
    ((BATCH, L, H, P, "fp16"), (BATCH, L, G, 0, "fp16"), errors.ShapeError, "B", "d_state (dim 3) must be >= 1"),
])
@pytest.mark.parametrize("family", ["ssd_fwd", "ssd_bwd"])
def test_workspace_size_checks_x_and_B_as_the_launch_does(family, x, B, error, argument, fragment):
    with pytest.raises(error) as info:
        runtime.workspace_size(family, x=fake_array(1 << 32, x[:4], x[4]), B=fake_array(1 << 33, B[:4], B[4]))
    assert info.value.argument == argument and fragment in str(info.value)


def test_workspace_size_refuses_a_keyword_the_launch_does_not_take():
    args = long_args()
    with pytest.raises(errors.InvalidArgumentError, match="did you mean 'cu_seqlens'") as info:
        runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"], cu_seqlen=args["x"])
    assert info.value.argument == "cu_seqlen"
    with pytest.raises(errors.InvalidArgumentError, match="not an argument of ssd_chunk_cumsum"):
        runtime.workspace_size("ssd_chunk_cumsum", foo=1)
    assert runtime.workspace_size("ssd_chunk_cumsum", stream=0) == 0   # (the launch's keywords, stream too)
    assert runtime.workspace_size("ssd_fwd", x=args["x"], B=args["B"], stream=0) > 0


@pytest.mark.parametrize("over,argument,fragment", [
    ({"d_state": 0}, "B", "d_state (dim 3) must be >= 1"),   # (it divided by zero planning the split)
    ({"x": fake_array(1 << 44, (1, 4096, 64, 0), "fp16"), "out": fake_array(1 << 45, (1, 4096, 64, 0), "fp16")},
     "x", "positive multiple of 64"),
])
def test_a_call_without_state_or_head_columns_is_refused(no_driver, over, argument, fragment):  # noqa: F811
    expect_refused("ssd_fwd", long_args(**over), errors.ShapeError, argument, fragment)


def test_an_unused_workspace_is_still_checked():
    """A call that is not split (the GPU full already) keeps the workspace among its arrays, so that a workspace
    over an output, on another device or read-only is refused whether or not the call is split."""
    (call,) = steps(**long_args(batch=4))
    assert call.inputs[-1].name == "workspace"


@pytest.mark.parametrize("change", [
    {"batch": 4},                 # 256 CTAs: the GPU is full
    {"seqlen": 500},              # too short for two segments of 256 tokens
    {"seq_idx": "row"},           # packed sequences are walked whole
    {"in_place": True},           # a segment's final state could overwrite another's initial state
])
def test_calls_that_are_not_split(change):
    over = {k: v for k, v in change.items() if k in ("batch", "seqlen")}
    args = long_args(**over)
    if "seq_idx" in change:
        args["seq_idx"] = fake_array(1 << 42, (1, 4096), "int32")
        del args["final_states"]
    if "in_place" in change:
        pool = fake_array(1 << 42, (8, 64, P, N), "fp32")
        idx = fake_array(1 << 43, (1,), "int32")
        args.update(initial_states=pool, final_states=pool, initial_state_indices=idx, final_state_indices=idx)
    (call,) = steps(**args)
    assert call.params["segments"] == 1 and call.params["states_only"] == 0


@pytest.mark.parametrize("change", ["seq_idx", "cu_seqlens", "in_place", "chunk_states"])
def test_calls_over_a_wave_that_are_not_handed_over(change):
    """300 CTAs over a long L would hand their segments over, but not with packed sequences (the segments would cut
    them), one pool read and written in place, or chunk_states asked for: one launch, unsplit."""
    from mamba2_aot.plans.ssd_fwd import plan_handover
    assert plan_handover(1, 4096, 300, P, N)[0] > 1
    args = long_args(heads=300)
    if change == "seq_idx":
        args["seq_idx"] = fake_array(1 << 42, (1, 4096), "int32")
        del args["final_states"]
    if change == "cu_seqlens":
        args["cu_seqlens"] = fake_array(1 << 42, (2,), "int32")
    if change == "in_place":
        pool = fake_array(1 << 42, (8, 300, P, N), "fp32")
        idx = fake_array(1 << 43, (1,), "int32")
        args.update(initial_states=pool, final_states=pool, initial_state_indices=idx, final_state_indices=idx)
    if change == "chunk_states":
        args["chunk_states"] = fake_array(1 << 41, (1, 16, 300, P, N), "fp32")
    (call,) = steps(**args)
    assert call.params["segments"] == 1 and call.params["has_segment_flags"] == 0 and call.zeroed == ()
    assert call.grid[2] == 1


def test_the_paired_kernel_takes_launches_whose_walk_would_share_sms():
    """paired_pays: from 67 pairs (134 walk CTAs, more than one per SM of 132) up, never below."""
    from mamba2_aot.plans.ssd_fwd import paired_pays
    assert [n for n in (1, 16, 64, 66, 67, 128, 132, 133, 140, 199, 264, 640) if paired_pays(n)] == \
        [67, 128, 132, 133, 140, 199, 264, 640]


def test_launches_go_to_the_paired_kernel_by_their_pairs():
    """The 2.7B shape's handover (320 pairs x 2 segments) and its unsplit call (320) pair, and so do 128 heads of two
    rows (128 pairs), 280 heads of one row (140) and 100 heads of 4 rows (200); 128 heads of one row (64), too short
    to split, do not. (With z at N 128: the other paired launches run on ssd_fwd_inline's cubins, below.)"""
    assert families(**long_args(batch=8, heads=80, gated=True)) == ["ssd_fwd_paired"]
    assert families(**long_args(batch=8, heads=80, gated=True, workspace=None)) == ["ssd_fwd_paired"]
    assert families(**long_args(batch=2, heads=128, gated=True, workspace=None)) == ["ssd_fwd_paired"]
    assert families(**long_args(heads=128, seqlen=500, gated=True, workspace=None)) == ["ssd_fwd"]
    assert families(**long_args(heads=280, gated=True, workspace=None)) == ["ssd_fwd_paired"]
    assert families(**long_args(batch=4, heads=100, gated=True, workspace=None)) == ["ssd_fwd_paired"]


def test_paired_launches_but_those_with_z_at_n128_run_on_the_inline_cubins():
    """ssd_fwd_inline runs every launch of two heads per CTA but those with z at N 128 (ssd_fwd_paired's), with its
    ``z_gate`` constant False without z at N 128 (the variant without z slots: rings of three), else True; the other
    families have no such constant. That holds for an inline split, a handover, the segments after a states-only pass
    and an unsplit call (the last three with an empty prefix: they enter from chunk states, or at the row's start)."""
    def routes(**args):
        return [(family, call.constants.get("z_gate")) for family, call in launches(**args)]
    paired, inline, ungated, states_pass = (("ssd_fwd_paired", None), ("ssd_fwd_inline", True),
                                            ("ssd_fwd_inline", False), ("ssd_fwd_pass", None))
    for args, n128, n128_with_z, n64 in (
            (dict(batch=2, heads=64, seqlen=2048), [ungated], [inline], [inline]),     # an inline split
            (dict(heads=128, seqlen=8192), [states_pass, ungated], [states_pass, paired], [states_pass, inline]),
            (dict(batch=8, heads=80), [ungated], [paired], [inline]),                  # a handover
            (dict(batch=8, heads=80, workspace=None), [ungated], [paired], [inline])):  # unsplit
        assert routes(**long_args(**args)) == n128
        assert routes(**long_args(**args, gated=True)) == n128_with_z
        assert routes(**long_args(**args, d_state=64)) == n64
        assert routes(**long_args(**args, d_state=64, gated=True)) == n64
    handover = steps(**long_args(batch=8, heads=80))[0]
    assert handover.params["has_segment_flags"] == 1 and handover.params["nchunks"] == 1
    segments = steps(**long_args(heads=128, seqlen=8192))[1]
    assert segments.params["segments"] == 2 and segments.params["nchunks"] == 1
    # (an inline split: nchunks 0, so that its segments walk from the row's start)
    assert steps(**long_args(batch=2, heads=64, seqlen=2048))[0].params["nchunks"] == 0


def test_a_states_only_splits_pass_runs_on_its_own_kernel_and_its_segments_pair():
    """B1 L8192 H128 (as the Nemotron-H-like reference shape): the states-only pass (128 heads) runs on ssd_fwd_pass,
    its 2 segments (128 pairs) on the paired kernel. The pass goes to ssd_fwd_pass whatever its pairs, and nothing else
    does (test_launches_the_paired_kernel_cannot_run_stay_on_the_walk). B2 L2048 H64, whose pass would walk 1024
    tokens, runs in one ssd_fwd_inline launch instead, workspace or not."""
    first, second = steps(**long_args(heads=128, seqlen=8192))
    assert first.params["states_only"] == 1 and second.params["segments"] == 2
    assert families(**long_args(heads=128, seqlen=8192, gated=True)) == ["ssd_fwd_pass", "ssd_fwd_paired"]
    b2 = long_args(batch=2, heads=64, seqlen=2048)
    assert families(**b2) == ["ssd_fwd_inline"]
    assert runtime.workspace_size("ssd_fwd", x=b2["x"], B=b2["B"]) == 0


def test_a_call_without_a_workspace_is_split_in_one_launch_with_an_inline_pass():
    """B2 L2048 H64 without a workspace: no room for an entering state, so its two segments run in one ssd_fwd_inline
    launch (128 pairs), the second walking the state alone over the first's tokens: the first segment the longer, by
    INLINE_PASS_COST; nothing stored between them (no chunk states)."""
    from mamba2_aot.plans.ssd_fwd import INLINE_PASS_COST, plan_inline
    args = long_args(batch=2, heads=64, seqlen=2048, workspace=None)
    ((family, call),) = launches(**args)
    segments, segment_len = plan_inline(64, 2048, N, gated=False)
    assert family == "ssd_fwd_inline" and call.grid == (2, 64, 2) and segments == 2
    assert {k: call.params[k] for k in ("inline_pass", "segments", "segment_len", "seqlen", "has_chunk_states",
                                        "states_only", "has_final_states")} == {
        "inline_pass": 1, "segments": 2, "segment_len": segment_len, "seqlen": 2048, "has_chunk_states": 0,
        "states_only": 0, "has_final_states": 1}
    assert segment_len % 64 == 0 and 1024 < segment_len <= 2048 - 256
    # the first segment's time (its tokens) against the second's (the inline pass, then its own tokens)
    assert abs(segment_len - (INLINE_PASS_COST[N, False] * segment_len + 2048 - segment_len)) <= 64


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("d_state", [64, 128])
@pytest.mark.parametrize("pairs,seqlen", [(64, 2048), (64, 8192), (16, 4096), (32, 8192), (48, 1024), (66, 600)])
def test_inline_segments_pair_fit_one_wave_and_beat_the_unsplit_row(pairs, seqlen, d_state, gated):
    from mamba2_aot.plans.ssd_fwd import INLINE_PASS_COST, MIN_SEGMENT, SMS, paired_pays, plan_inline
    segments, segment_len = plan_inline(pairs, seqlen, d_state, gated)
    c = INLINE_PASS_COST[d_state, gated]
    if segments == 1:  # only when two segments (one wave at 66 pairs) would leave the last too short
        assert pairs == 66 and seqlen - math.ceil(seqlen / (64 * (2 - c))) * 64 < MIN_SEGMENT
        return
    last = seqlen - (segments - 1) * segment_len
    assert paired_pays(pairs * segments) and pairs * segments <= SMS
    assert segment_len % 64 == 0 and MIN_SEGMENT <= last <= segment_len
    longest = max((1 + c * (segments - 2)) * segment_len, c * (segments - 1) * segment_len + last)
    assert longest < seqlen


@pytest.mark.parametrize("change", ["chunk_states", "d_state_256", "odd_heads_per_group", "workspace"])
def test_calls_that_get_no_inline_pass(change):
    """An inline pass only for a call the states-only split would split whose segments pair, without a workspace or
    with a pass of at most INLINE_PASS_MAX tokens: not with chunk_states (they hold the entering states: two
    launches), N 256 or an odd number of heads per group (the walk: unsplit), nor with a workspace and a long pass
    (two launches)."""
    args = long_args(batch=2, heads=64, seqlen=2048, workspace=None)
    if change == "chunk_states":
        args["chunk_states"] = fake_array(1 << 41, (2, 8, 64, P, N), "fp32")
    if change == "d_state_256":
        args.update(long_args(batch=2, heads=64, seqlen=2048, workspace=None, d_state=256))
    if change == "odd_heads_per_group":  # 48 heads in 16 groups: 96 CTAs, split; a CTA's two heads would read two Bs
        args.update(long_args(batch=2, heads=48, seqlen=2048, workspace=None))
        args["B"] = fake_array(1 << 44, (2, 2048, 16, N), "fp16")
        args["C"] = fake_array(1 << 45, (2, 2048, 16, N), "fp16")
    if change == "workspace":  # (B1 L8192 H128: a pass of 4096 tokens)
        args = long_args(heads=128, seqlen=8192)
    calls = steps(**args)
    assert all(call.params["inline_pass"] == 0 for call in calls)
    assert len(calls) == (2 if change in ("chunk_states", "workspace") else 1)


@pytest.mark.parametrize("change", ["seq_idx", "odd_heads_per_group", "d_state_256", "states_only"])
def test_launches_the_paired_kernel_cannot_run_stay_on_the_walk(change, monkeypatch):
    heads, groups, d_state = 600, 1, N
    if change == "states_only":  # every launch has pairs enough: the split's segments pair, its pass runs on its own
        from mamba2_aot.plans import ssd_fwd
        monkeypatch.setattr(ssd_fwd, "paired_pays", lambda pairs: True)
        assert families(**long_args(heads=128, seqlen=8192, gated=True)) == ["ssd_fwd_pass", "ssd_fwd_paired"]
        return
    if change == "odd_heads_per_group":
        groups = 200  # 3 heads per group: a CTA's two heads would read different B and C
    if change == "d_state_256":
        d_state = 256
    args = long_args(heads=heads, d_state=d_state, workspace=None, seqlen=512, gated=True)
    args["B"] = fake_array(1 << 44, (1, 512, groups, d_state), "fp16")
    args["C"] = fake_array(1 << 45, (1, 512, groups, d_state), "fp16")
    if change == "seq_idx":
        args["seq_idx"] = fake_array(1 << 42, (1, 512), "int32")
        del args["final_states"]
    assert families(**args) == ["ssd_fwd"]
    if change == "seq_idx":
        del args["seq_idx"]
        args["final_states"] = fake_array(1 << 46, (1, heads, P, d_state), "fp32")
        assert families(**args) == ["ssd_fwd_paired"]


@pytest.mark.parametrize("step", ["ssd_fwd_paired", "ssd_fwd_pass"])
def test_the_paired_kernel_and_the_pass_are_steps_not_families_of_their_own(step):
    assert step in PLANS["ssd_fwd"].step_families
    with pytest.raises(errors.InvalidArgumentError, match="a step of ssd_fwd"):
        runtime.launch(step, **ssd_args())


@pytest.mark.parametrize("workspace,error,fragment", [
    (fake_array(1 << 40, (1024,), "fp16"), errors.DTypeError, "expected dtype fp32"),
    (fake_array(1 << 40, (1024,), "fp32", (2,)), errors.ShapeError, "contiguous fp32"),
    (fake_array((1 << 40) + 4, (1024,), "fp32"), errors.AlignmentError, "16-byte aligned"),
    (fake_array(1 << 32, (1 << 20,), "fp32"), errors.AliasingError, "overlaps x"),  # x's memory
    (FakeCAI(1 << 40, (1024,), "<f4", (4,), readonly=True), errors.InvalidArgumentError, "read-only"),
])
def test_a_bad_workspace_is_refused(no_driver, workspace, error, fragment):  # noqa: F811
    expect_refused("ssd_fwd", long_args(workspace=workspace), error, "workspace", fragment)


@st.composite
def strided_views(draw):
    """x, z, out, B, C (fp16) as views of wider rows (padding a multiple of 8 elements, as a fused projection's
    column slices are), dt as a strided column; a base offset that keeps (or, with ``misalign``, breaks) 16-byte
    alignment of one vector operand."""
    batch, L = draw(st.integers(1, 4)), draw(st.integers(1, 5000))
    G = draw(st.sampled_from([1, 2, 4]))
    H = G * draw(st.integers(1, 4))
    P, N = draw(st.sampled_from([64, 128])), draw(st.sampled_from([64, 128, 256]))
    pad = 8 * draw(st.integers(0, 3))
    base = iter(range(1 << 32, 1 << 40, 1 << 31))  # 2 GiB apart: no two views overlap

    def view(shape, inner):  # rows of `inner` elements plus padding, the last dims dense
        row = inner + pad
        strides = (L * row, row) + contiguous(shape[2:])
        return fake_array(next(base), shape, "fp16", strides)

    arrays = {"x": view((batch, L, H, P), H * P), "z": view((batch, L, H, P), H * P),
              "out": view((batch, L, H, P), H * P), "B": view((batch, L, G, N), G * N),
              "C": view((batch, L, G, N), G * N),
              "dt": fake_array(next(base), (batch, L, H), "fp16", (L * (H + 3), H + 3, 1)),
              "A": fake_array(next(base), (H,), "fp32"), "D": fake_array(next(base), (H, P), "fp32")}
    misaligned = draw(st.sampled_from([None, "x", "z", "out", "B", "C"]))
    if misaligned:
        cai = arrays[misaligned].__cuda_array_interface__
        arrays[misaligned] = fake_array(cai["data"][0] + 2 * draw(st.integers(1, 7)), cai["shape"], "fp16",
                                        tuple(s // 2 for s in cai["strides"]))
    return arrays, misaligned, (batch, H, P, N)


@given(strided_views())
@settings(max_examples=60, deadline=None)
def test_strided_views_bind_exactly_or_name_the_misaligned_operand(case):
    arrays, misaligned, (batch, H, P, N) = case
    if misaligned is None:
        call = bind(**arrays, chunk_size=64)
        assert call.grid == (P // 64, H, batch)
        assert call.params["stride_x_seqlen"] == arrays["x"].__cuda_array_interface__["strides"][1] // 2
        assert call.params["stride_dt_seqlen"] == H + 3 and call.params["has_z"] == 1
    else:
        with pytest.raises(errors.AlignmentError) as info:
            bind(**arrays, chunk_size=64)
        assert info.value.argument == misaligned


SSD_OPTIONS = ("z", "D", "dt_bias", "initial_states", "final_states", "chunk_states", "workspace", "seq_idx")
SSD_WRITTEN = ("out", "final_states", "chunk_states", "workspace")
# (a workspace may be any size; x, z, B, C, out and the workspace move 16 bytes at a time, chunk_states 8; the states
# are headdim × d_state blocks; the kernels take any stride along the last dim of A, D, dt, dt_bias and seq_idx)
SSD_EXEMPT = dict(free_dims={"workspace": {0}}, vectors=("x", "z", "B", "C", "out", "workspace", "chunk_states"),
                  blocks=("initial_states", "final_states", "chunk_states"),
                  free_last_stride=("A", "D", "dt", "dt_bias", "seq_idx"))


def ssd_options_args(chunk_size: int) -> dict:
    """ssd_args with every option the property test draws: chunk states for this chunk size, a workspace, seq_idx."""
    return ssd_args(chunk_size=chunk_size, workspace=fake_array(0x7000_0000, (1 << 16,), "fp32"),
                    seq_idx=fake_array(0x7400_0000, (BATCH, L), "int32"),
                    chunk_states=fake_array(0x7800_0000, (BATCH, -(-L // chunk_size), H, P, N)))


@pytest.mark.parametrize("target", corruption_targets([ssd_options_args(128)], SSD_WRITTEN, **SSD_EXEMPT),
                         ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid call (options drawn) with one array made wrong (each argument, each way): a typed refusal naming one
    of the call's arguments (the one made wrong, where nothing else can be), and the driver never opened."""
    args = ssd_options_args(data.draw(st.sampled_from([64, 128, 256]), label="chunk_size"))
    for name in SSD_OPTIONS:
        if target[0] != name and data.draw(st.booleans(), label=f"drop {name}"):
            del args[name]
    # (seq_idx packing takes no states per row at batch 2)
    for name in ("initial_states", "final_states") if "seq_idx" in args else ():
        if name == target[0]:
            del args["seq_idx"]
            break
        args.pop(name, None)
    if data.draw(st.booleans(), label="one pool") and {"initial_states", "final_states"} <= set(args):
        args["final_states"] = args["initial_states"]   # (a pool read and written in place: allowed)
    expect_valid_call("ssd_fwd", args)
    # initial and final states share the state dtype: fp32, or a pool's bf16 / fp16; one given alone may take fp16
    lone_state = {"initial_states", "final_states"} - set(args)
    dtypes = {name: {"<f2"} for name in ("initial_states", "final_states") if lone_state and name in args}
    # (a workspace is written only where the call is split, and only that part must not overlap an input)
    in_place = [("initial_states", "final_states")] + [("workspace", k) for k in args if k not in SSD_WRITTEN]
    aliased = corrupt_one_argument(data, args, SSD_WRITTEN, target, dtypes=dtypes, in_place=in_place, **SSD_EXEMPT)
    expect_corrupted_call_refused("ssd_fwd", args, target, aliased)
