"""The verify launch plan's fused pre-conv on the CPU: ``xBC`` (batch, T, H·P + 2·G·N) with ``conv_state``,
``conv_weight``, ``conv_bias``, ``activation``, ``tickets`` (and in compact mode ``conv_window_count`` /
``conv_window_xBC``) instead of x, B, C. A good fused call binds every kernel parameter and selects
``conv_dtype`` = the conv pool's dtype ("none" for an unfused call); each bad combination is refused with a
typed error naming the argument, before the driver is touched."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors
from mamba2_aot.plans import PLANS
from mamba2_aot.tensors import as_device_array
from mamba2_aot.validation import check_call
from runtime_fakes import (FakeDLPack, corrupt_one_argument, corruption_targets,  # noqa: F401
                           expect_corrupted_call_refused, expect_refused, expect_valid_call, fake_array,
                           no_driver)  # (no_driver: a fixture)
from test_verify_plan import BATCH, CAP, G, H, MB, MODES, N, P, SLOTS, T, VERIFY_EXEMPT, verify_args

TICKETS = (SLOTS, G + 1)   # the fused call's arrival counters: one per (slot, group), then one per slot

K = 4
CH = H * P + 2 * G * N          # Mamba-2's [x | B | C] channels: 8·64 + 2·2·128 = 1024
STATE_AT = 0x30000000           # the SSM pool (4 MiB), clear of verify_args' arrays (8 MiB apart from 0x10000000)
CONV_AT = 0x40000000            # the fused conv's arrays, 1 MiB apart
IO_AT = 0x50000000              # verify_args' I/O arrays again, in another I/O dtype
ELSEWHERE = 0x70000000          # a replacement array's address
CONV_WINDOW = ("conv_window_count", "conv_window_xBC")


def _fake(ptr, shape, dtype, strides=None):
    """A fake CUDA array (element strides); bf16 through DLPack (``__cuda_array_interface__`` cannot express it)."""
    if dtype == "bf16":
        return FakeDLPack(ptr, shape, code=4, bits=16, strides=strides)
    return fake_array(ptr, shape, dtype, strides)


def _shape(fake):
    return tuple(fake.__cuda_array_interface__["shape"]) if hasattr(fake, "__cuda_array_interface__") else fake.shape


def fused_args(mode="update", *, io="fp16", pool="fp32", conv_pool=None, **over):
    """Valid fused-call fake arguments: verify_args without x, B and C, plus the conv arrays. I/O arrays in
    ``io`` (bf16: DLPack fakes), the SSM pool in ``pool``, the conv pool in ``conv_pool`` (default: ``io``)."""
    args = verify_args(mode)
    for name in ("x", "B", "C"):
        del args[name]
    args["state"] = _fake(STATE_AT, (SLOTS, H, P, N), pool)   # verify_args' pool spans four of its slots
    if io != "fp16":
        io_base = iter(range(IO_AT, ELSEWHERE, MB))
        for name in ("dt", "z", "out") + (("window_x", "window_B", "window_dt") if mode == "compact" else ()):
            args[name] = _fake(next(io_base), _shape(args[name]), io)
    base = iter(range(CONV_AT, IO_AT, MB))
    arr = lambda shape, dtype: _fake(next(base), shape, dtype)  # noqa: E731
    args.update(xBC=arr((BATCH, T, CH), io), conv_state=arr((SLOTS, CH, K - 1), conv_pool or io),
                conv_weight=arr((CH, K), "fp32"), conv_bias=arr((CH,), "fp32"), activation="silu",
                tickets=arr(TICKETS, "int32"))
    if mode == "compact":
        args.update(conv_window_count=arr((SLOTS,), "int32"), conv_window_xBC=arr((SLOTS, CAP, CH), io))
    args.update(over)
    return args


def _is_array(value):
    return hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__")


def bind(**args):
    """plan.bind on every array argument adapted (as the dispatcher does), then the checks every kernel gets."""
    call = PLANS["verify"].bind(**{k: as_device_array(v, k) if _is_array(v) else v for k, v in args.items()})
    check_call(call)
    return call


def test_tickets_is_adapted_like_every_array_argument():
    """Every array keyword of a fused call must be in plan.arrays (the dispatcher adapts only those)."""
    plan = PLANS["verify"]
    array_keywords = {k for k, v in fused_args("compact").items() if _is_array(v)}
    assert array_keywords - set(plan.arrays) == set()


def test_good_fused_call_passes_the_plan_through_launch(no_driver):  # noqa: F811
    """Through dispatch.launch: the call passes validation and fails only at the variant lookup / driver."""
    from mamba2_aot import dispatch
    with pytest.raises((errors.VariantNotFoundError, errors.CubinPackageError, AssertionError)):
        dispatch.launch("verify", stream=0, **fused_args(io="bf16", conv_pool="bf16"))


# (io, SSM pool, conv pool): the conv pool is in the I/O dtype or fp32, independent of the SSM pool
DTYPES = [("fp16", "fp32", "fp16"), ("fp16", "fp16", "fp32"), ("bf16", "fp32", "bf16"), ("bf16", "bf16", "bf16")]


@pytest.mark.parametrize("io,pool,conv_pool", DTYPES)
@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_good_fused_call_binds_every_parameter(mode, io, pool, conv_pool):
    plan = PLANS["verify"]
    args = fused_args(mode, io=io, pool=pool, conv_pool=conv_pool)
    call = bind(**args)
    p = call.params
    assert set(p) == set(plan.param_names)
    assert call.grid == (H, BATCH, 1)
    assert call.constants == {"mode": mode, "headdim": P, "d_state": N, "io_dtype": io, "pool_dtype": pool,
                              "conv_dtype": conv_pool}
    assert (p["batch"], p["seqlen"], p["nheads"], p["num_slots"]) == (BATCH, T, H, SLOTS)
    assert p["heads_per_group"] == H // G, "G comes from the channel count"
    assert (p["channels"], p["width"], p["has_conv_bias"], p["silu"]) == (CH, K, 1, 1)
    assert p["window_capacity"] == (CAP if mode == "compact" else 0)
    # the conv arrays: pointers and element strides as the kernel indexes them
    assert p["xBC"] == CONV_AT and p["conv_state"] == CONV_AT + MB and p["tickets"] == CONV_AT + 4 * MB
    assert (p["stride_xBC_batch"], p["stride_xBC_seqlen"], p["stride_xBC_channel"]) == (T * CH, CH, 1)
    assert (p["stride_conv_state_slot"], p["stride_conv_state_channel"], p["stride_conv_state_tap"]) == \
        (CH * (K - 1), K - 1, 1)
    assert (p["stride_conv_weight_channel"], p["stride_conv_weight_tap"], p["stride_conv_bias_channel"]) == (K, 1, 1)
    assert (p["stride_tickets_slot"], p["stride_tickets_group"]) == (G + 1, 1)
    # x, B and C are not passed: null pointers with zero strides (the kernel reads the staged conv row instead)
    for name in ("x", "B", "C"):
        assert p[name] == 0 and all(v == 0 for k, v in p.items() if k.startswith(f"stride_{name}_")), name
    names_in = {a.name for a in call.inputs}
    names_out = {a.name for a in call.outputs}
    assert {"xBC", "conv_weight", "conv_bias", "dt", "A"} <= names_in and not {"x", "B", "C"} & names_in
    assert {"out", "state", "conv_state", "tickets"} <= names_out, "both pools and the tickets are written"
    if mode == "compact":
        assert p["conv_window_count"] == CONV_AT + 5 * MB and p["conv_window_xBC"] == CONV_AT + 6 * MB
        assert p["stride_conv_window_count_slot"] == 1
        assert (p["stride_conv_window_xBC_slot"], p["stride_conv_window_xBC_row"],
                p["stride_conv_window_xBC_channel"]) == (CAP * CH, CH, 1)
        assert set(CONV_WINDOW) | {"window_count", "window_x", "window_B", "window_dt"} <= names_out
    else:
        for name in CONV_WINDOW:
            assert p[name] == 0 and all(v == 0 for k, v in p.items() if k.startswith(f"stride_{name}_")), name


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_unfused_call_selects_no_conv(mode):
    """Without xBC the variant is conv_dtype "none" and every conv parameter is null / zero."""
    call = bind(**verify_args(mode, state=_fake(STATE_AT, (SLOTS, H, P, N), "fp32")))
    p = call.params
    assert call.constants["conv_dtype"] == "none"
    assert (p["channels"], p["width"], p["has_conv_bias"], p["silu"]) == (0, 0, 0, 0)
    for name in ("xBC", "conv_state", "conv_weight", "conv_bias", "tickets") + CONV_WINDOW:
        assert p[name] == 0 and all(v == 0 for k, v in p.items() if k.startswith(f"stride_{name}_")), name
    assert p["x"] != 0 and p["B"] != 0 and p["C"] != 0


@pytest.mark.parametrize("width", [2, 3])
def test_conv_options_bind_their_flags(width):
    call = bind(**fused_args(conv_weight=_fake(ELSEWHERE, (CH, width), "fp32"), conv_bias=None, activation=None,
                             conv_state=_fake(ELSEWHERE + MB, (SLOTS, CH, width - 1), "fp16")))
    p = call.params
    assert (p["width"], p["has_conv_bias"], p["silu"]) == (width, 0, 0)
    assert p["conv_bias"] == 0 and p["stride_conv_bias_channel"] == 0
    assert "conv_bias" not in {a.name for a in call.inputs}


def test_strided_conv_views_record_their_strides():
    """xBC sliced out of a wider projection, a conv pool with padded slots: any strides (element units)."""
    wide = _fake(ELSEWHERE, (BATCH, T, CH), "fp16", strides=(T * 3 * CH, 3 * CH, 1))
    pool = _fake(ELSEWHERE + 8 * MB, (SLOTS, CH, K - 1), "fp16", strides=(CH * K * 2, K, 1))
    p = bind(**fused_args(xBC=wide, conv_state=pool)).params
    assert (p["stride_xBC_batch"], p["stride_xBC_seqlen"], p["stride_xBC_channel"]) == (T * 3 * CH, 3 * CH, 1)
    assert (p["stride_conv_state_slot"], p["stride_conv_state_channel"]) == (CH * K * 2, K)


@pytest.mark.parametrize("ngroups", [1, 2, 4, 8])
def test_groups_come_from_the_channel_count(ngroups):
    channels = H * P + 2 * ngroups * N
    call = bind(**fused_args(xBC=_fake(ELSEWHERE, (BATCH, T, channels), "fp16"),
                             conv_weight=_fake(ELSEWHERE + MB, (channels, K), "fp32"),
                             conv_bias=_fake(ELSEWHERE + 2 * MB, (channels,), "fp32"),
                             conv_state=_fake(ELSEWHERE + 3 * MB, (SLOTS, channels, K - 1), "fp16"),
                             tickets=fake_array(ELSEWHERE + 4 * MB, (SLOTS, ngroups + 1), "int32")))
    assert call.params["heads_per_group"] == H // ngroups and call.params["channels"] == channels


def test_compact_accepts_a_commit_without_new_rows():
    """T = 0 in compact mode only folds (both pools) and rewrites both window counts: it still launches."""
    call = bind(**fused_args("compact", xBC=_fake(ELSEWHERE, (BATCH, 0, CH), "fp16"),
                             out=_fake(ELSEWHERE + MB, (BATCH, 0, H, P), "fp16"),
                             dt=_fake(ELSEWHERE + 2 * MB, (BATCH, 0, H), "fp16"),
                             z=_fake(ELSEWHERE + 3 * MB, (BATCH, 0, H, P), "fp16")))
    assert call.grid == (H, BATCH, 1) and call.params["seqlen"] == 0


def test_ci_build_has_the_variants_the_plan_selects():
    """The bf16 calls select variants of the ci build (fused on a bf16 conv pool, and unfused)."""
    pytest.importorskip("cutlass", reason="needs the CuTe DSL (requirements/build.txt)")
    import sys
    import tomllib
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from kernel_src.families import expand
    with open(ROOT / "build_configs" / "ci.toml", "rb") as f:
        built = [c for family, c in expand(tomllib.load(f)) if family == "verify"]
    for mode in ("update", "snapshot", "compact"):
        for pool in ("fp32", "bf16"):
            assert bind(**fused_args(mode, io="bf16", pool=pool, conv_pool="bf16")).constants in built
            unfused = fused_args(mode, io="bf16", pool=pool)
            unfused.update(x=_fake(ELSEWHERE, (BATCH, T, H, P), "bf16"),
                           B=_fake(ELSEWHERE + MB, (BATCH, T, G, N), "bf16"),
                           C=_fake(ELSEWHERE + 2 * MB, (BATCH, T, G, N), "bf16"))
            for name in ("xBC", "conv_state", "conv_weight", "conv_bias", "activation", "tickets") + CONV_WINDOW:
                unfused.pop(name, None)
            assert bind(**unfused).constants in built


def test_every_fused_dtype_combination_the_plan_accepts_is_a_variant():
    pytest.importorskip("cutlass", reason="needs the CuTe DSL (requirements/build.txt)")
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from kernel_src.families import kernel_class
    combination_error = kernel_class("verify").combination_error
    for io in ("bf16", "fp16", "fp32"):
        for conv_pool in ("bf16", "fp16", "fp32"):
            try:
                bind(**fused_args(io=io, conv_pool=conv_pool))
            except errors.InvalidArgumentError:
                continue
            assert combination_error(io_dtype=io, conv_dtype=conv_pool) is None, (io, conv_pool)


def _f16(shape, offset=0, dtype="fp16"):
    return _fake(ELSEWHERE + offset, shape, dtype)


def _i32(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "int32")


# (mode, change to fused_args, error, argument, message fragment)
FUSED_BAD = [
    # x, B, C are what the fused conv computes: never passed with xBC
    ("update", {"x": _f16((BATCH, T, H, P))}, errors.InvalidArgumentError, "x", "not taken with xBC"),
    ("snapshot", {"B": _f16((BATCH, T, G, N))}, errors.InvalidArgumentError, "B", "not taken with xBC"),
    ("compact", {"C": _f16((BATCH, T, G, N))}, errors.InvalidArgumentError, "C", "not taken with xBC"),
] + [
    # what the fused conv needs
    (mode, {name: None}, errors.ArrayProtocolError, name, "required, got None")
    for mode in ("update", "compact") for name in ("conv_state", "conv_weight", "tickets")
] + [
    ("compact", {name: None}, errors.InvalidArgumentError, name, "required in compact mode") for name in CONV_WINDOW
] + [
    ("update", {"conv_window_count": _i32((SLOTS,))}, errors.InvalidArgumentError, "conv_window_count",
     "not used in update mode"),
    ("snapshot", {"conv_window_xBC": _f16((SLOTS, CAP, CH))}, errors.InvalidArgumentError, "conv_window_xBC",
     "not used in snapshot mode"),
] + [
    # channels = H·P + 2·G·N for a G dividing H (N from the SSM pool): otherwise the split is undefined
    ("update", {"xBC": _f16((BATCH, T, channels))}, errors.ShapeError, "xBC",
     "is not nheads·headdim + 2·ngroups·d_state")
    for channels in (H * P + 2 * 3 * N,      # G = 3 does not divide H = 8
                     H * P + 2 * 16 * N,     # G = 16 > H
                     H * P + 2 * G * N + 2,  # not a multiple of 2·N past the x channels
                     H * P + N,              # half a group
                     H * P,                  # no B, C channels
                     H * P - 2 * N)          # fewer channels than x alone
] + [
    ("update", {"xBC": _f16((BATCH, T, CH), dtype="fp32")}, errors.DTypeError, "xBC", "expected dtype fp16, got fp32"),
    ("update", {"xBC": _f16((BATCH, T + 1, CH))}, errors.ShapeError, "xBC", f"expected shape {(BATCH, T, CH)}"),
    ("update", {"xBC": _f16((BATCH + 1, T, CH))}, errors.ShapeError, "xBC", f"expected shape {(BATCH, T, CH)}"),
    ("update", {"xBC": _f16((BATCH, T * CH))}, errors.ShapeError, "xBC", "expected 3 dims"),
    ("update", {"activation": "relu"}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    ("update", {"conv_weight": _i32((CH, K))}, errors.DTypeError, "conv_weight", "expected dtype fp32"),
    ("update", {"conv_weight": _f16((CH + 1, K), dtype="fp32")}, errors.ShapeError, "conv_weight",
     f"expected shape {(CH, K)}"),
    ("update", {"conv_weight": _f16((CH, 5), dtype="fp32"), "conv_state": _f16((SLOTS, CH, 4), MB)},
     errors.ShapeError, "conv_weight", "width (dim 1) = 5 must be in 2..4"),
    ("update", {"conv_bias": _f16((CH,))}, errors.DTypeError, "conv_bias", "expected dtype fp32"),
    # the conv pool: raw inputs, in the I/O dtype or fp32; one slot index for both pools
    ("update", {"conv_state": _f16((SLOTS, CH, K - 1), dtype="bf16")}, errors.DTypeError, "conv_state",
     "expected dtype fp16 or fp32, got bf16"),
    ("update", {"conv_state": _i32((SLOTS, CH, K - 1))}, errors.DTypeError, "conv_state",
     "expected dtype fp16 or fp32, got int32"),
    ("snapshot", {"conv_state": _f16((SLOTS + 1, CH, K - 1))}, errors.ShapeError, "conv_state",
     f"{SLOTS + 1} slots, the SSM pool has {SLOTS}"),
    ("compact", {"conv_state": _f16((SLOTS - 1, CH, K - 1))}, errors.ShapeError, "conv_state",
     f"{SLOTS - 1} slots, the SSM pool has {SLOTS}"),
    ("update", {"conv_state": _f16((SLOTS, CH, K))}, errors.ShapeError, "conv_state",
     "(num_slots, channels, width - 1)"),
    ("update", {"conv_state": _f16((SLOTS, CH + 1, K - 1))}, errors.ShapeError, "conv_state",
     f"expected shape {(SLOTS, CH, K - 1)}"),
    # the conv window record: per slot, in the I/O dtype, the SSM window's capacity
    ("compact", {"conv_window_xBC": _f16((SLOTS, CAP + 1, CH))}, errors.ShapeError, "conv_window_xBC",
     f"capacity {CAP + 1} differs from window_x's {CAP}"),
    ("compact", {"conv_window_xBC": _f16((SLOTS, CAP - 1, CH))}, errors.ShapeError, "conv_window_xBC",
     f"capacity {CAP - 1} differs from window_x's {CAP}"),
    ("compact", {"conv_window_xBC": _f16((SLOTS, CAP, CH), dtype="fp32")}, errors.DTypeError, "conv_window_xBC",
     "expected dtype fp16, got fp32"),
    ("compact", {"conv_window_xBC": _f16((SLOTS, CAP, CH + 1))}, errors.ShapeError, "conv_window_xBC",
     f"expected shape {(SLOTS, CAP, CH)}"),
    ("compact", {"conv_window_count": _i32((SLOTS + 1,))}, errors.ShapeError, "conv_window_count",
     f"expected shape {(SLOTS,)}"),
    ("compact", {"conv_window_count": fake_array(ELSEWHERE, (SLOTS,), "int64")}, errors.DTypeError,
     "conv_window_count", "int32"),
] + [
    # the tickets: int32 counters per (slot, group) and per slot, in every fused mode
    (mode, {"tickets": tickets}, error, "tickets", fragment)
    for mode in ("update", "snapshot", "compact")
    for tickets, error, fragment in ((_i32((SLOTS + 1, G + 1)), errors.ShapeError, f"expected shape {TICKETS}"),
                                     (_i32((SLOTS,)), errors.ShapeError, "expected 2 dims (num_slots, ngroups + 1)"),
                                     (_i32((SLOTS, G)), errors.ShapeError, f"expected shape {TICKETS}"),
                                     (fake_array(ELSEWHERE, TICKETS, "int64"), errors.DTypeError, "int32"))
]


@pytest.mark.parametrize("mode,change,error,argument,fragment", FUSED_BAD)
def test_refused_fused_calls_name_the_argument_and_never_reach_the_driver(no_driver,  # noqa: F811
                                                                          mode, change, error, argument, fragment):
    expect_refused("verify", fused_args(mode, **change), error, argument, fragment)


# (mode, change to verify_args (unfused: x, B, C given), error, argument, fragment)
UNFUSED_BAD = [
    (mode, {name: value}, errors.InvalidArgumentError, name, "given without xBC")
    for mode in ("update", "compact")
    for name, value in (("conv_state", _f16((SLOTS, CH, K - 1))), ("conv_weight", _f16((CH, K), dtype="fp32")),
                        ("conv_bias", _f16((CH,), dtype="fp32")), ("tickets", _i32((SLOTS,))))
] + [
    # the conv window record belongs to the fused call: without xBC it is refused as the other conv arrays are
    (mode, {name: value}, errors.InvalidArgumentError, name, "given without xBC")
    for mode in ("update", "compact")
    for name, value in (("conv_window_count", _i32((SLOTS,))), ("conv_window_xBC", _f16((SLOTS, CAP, CH))))
]


@pytest.mark.parametrize("mode,change,error,argument,fragment", UNFUSED_BAD)
def test_conv_arrays_without_xBC_are_refused(no_driver, mode, change, error,  # noqa: F811
                                             argument, fragment):
    expect_refused("verify", verify_args(mode, **change), error, argument, fragment)


def test_outputs_sharing_memory_are_refused(no_driver):  # noqa: F811
    args = fused_args("compact")
    at_rejected = fake_array(args["rejected"].__cuda_array_interface__["data"][0], TICKETS, "int32")
    expect_refused("verify", {**args, "tickets": at_rejected}, errors.AliasingError, "tickets", "overlaps rejected")
    expect_refused("verify", {**args, "conv_window_count": fake_array(
                       args["tickets"].__cuda_array_interface__["data"][0], (SLOTS,), "int32")}, errors.AliasingError,
                   "conv_window_count", "overlaps tickets")
    args = fused_args()
    expect_refused("verify", {**args, "conv_state": _fake(STATE_AT, (SLOTS, CH, K - 1), "fp16")},
                   errors.AliasingError, "conv_state", "overlaps state")
    expect_refused("verify", {**args, "out": _fake(CONV_AT, (BATCH, T, H, P), "fp16")}, errors.AliasingError, "out",
                   "overlaps xBC")


def test_compact_rows_beyond_the_capacity_name_xBC(no_driver):  # noqa: F811
    rows = CAP + 1
    args = fused_args("compact", xBC=_f16((BATCH, rows, CH)), out=_f16((BATCH, rows, H, P), MB),
                      dt=_f16((BATCH, rows, H), 2 * MB), z=_f16((BATCH, rows, H, P), 3 * MB))
    with pytest.raises(errors.ShapeError, match=f"T = {rows} new rows exceed the window capacity {CAP}") as info:
        from mamba2_aot import dispatch
        dispatch.launch("verify", stream=0, **args)
    assert info.value.argument == "xBC"


def test_fused_calls_take_at_most_16_rows(no_driver):  # noqa: F811
    """All of a fused call's rows are staged at once in shared memory; longer inputs are a prefill."""
    rows = 17
    args = fused_args("update", xBC=_f16((BATCH, rows, CH)), out=_f16((BATCH, rows, H, P), MB),
                      dt=_f16((BATCH, rows, H), 2 * MB), z=_f16((BATCH, rows, H, P), 3 * MB))
    expect_refused("verify", args, errors.ShapeError, "xBC", "at most 16 rows")


def test_rows_of_xBC_and_out_disagreeing_name_xBC_with_its_own_shape(no_driver):  # noqa: F811
    """The rules on T (at most 16 fused rows, at least 1 outside compact mode) are checked on a T that xBC has:
    out and xBC disagreeing is a shape error first, not a refusal quoting out's T against xBC."""
    rows = 17
    args = fused_args("update", out=_f16((BATCH, rows, H, P), MB), dt=_f16((BATCH, rows, H), 2 * MB),
                      z=_f16((BATCH, rows, H, P), 3 * MB))   # xBC keeps its T rows
    expect_refused("verify", args, errors.ShapeError, "xBC", f"expected shape {(BATCH, rows, CH)}")
    args = fused_args("update", out=_f16((BATCH, 0, H, P), MB), dt=_f16((BATCH, 0, H), 2 * MB),
                      z=_f16((BATCH, 0, H, P), 3 * MB))
    expect_refused("verify", args, errors.ShapeError, "xBC", f"expected shape {(BATCH, 0, CH)}")


def test_plan_limits_are_the_kernels():
    """The runtime cannot import kernel_src: the limits it enforces are copies of the kernels' constants (a fused
    call of more rows than the kernel stages would index past its shared memory)."""
    pytest.importorskip("cutlass", reason="needs the CuTe DSL (requirements/build.txt)")
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from kernel_src import conv1d_fwd, conv1d_verify, conv_window
    from kernel_src import verify as verify_kernel
    from mamba2_aot.plans import conv1d_fwd as fwd_plan
    from mamba2_aot.plans import conv1d_verify as conv_verify_plan
    from mamba2_aot.plans import conv_inputs
    from mamba2_aot.plans import verify as verify_plan
    assert verify_plan.MAX_FUSED_ROWS == verify_kernel.STAGED_ROWS
    assert conv_inputs.MAX_WIDTH == conv_window.MAX_WIDTH
    assert (fwd_plan.CHANNELS_PER_CTA, fwd_plan.TOKENS_PER_CTA) == (conv1d_fwd.CHANNELS_PER_CTA,
                                                                    conv1d_fwd.TOKENS_PER_CTA)
    assert conv_verify_plan.CHANNELS_PER_CTA == conv1d_verify.CHANNELS_PER_CTA


FUSED_WRITTEN = ("out", "state", "rejected", "conv_state", "tickets", "window_count", "window_x", "window_B",
                 "window_dt") + CONV_WINDOW   # (by any mode)
# (verify's rules, and the conv kernels take any stride along the last dim of their arrays)
FUSED_EXEMPT = dict(VERIFY_EXEMPT, free_last_stride=VERIFY_EXEMPT["free_last_stride"] + CONV_WINDOW
                    + ("xBC", "conv_state", "conv_weight", "conv_bias", "tickets"))


@pytest.mark.parametrize("target", corruption_targets([fused_args(mode, conv_pool="fp32") for mode in MODES],
                                                      FUSED_WRITTEN, **FUSED_EXEMPT), ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid fused call (mode, conv pool dtype and options drawn) with one array made wrong (each argument, each
    way): a typed refusal naming one of the call's arguments (the one made wrong, where nothing else can be), and the
    driver never opened."""
    from mamba2_aot import runtime
    mode = data.draw(st.sampled_from([m for m in MODES if target[0] in fused_args(m)]), label="mode")
    args = fused_args(mode, conv_pool=data.draw(st.sampled_from(["fp16", "fp32"]), label="conv pool"))
    for name in ("D", "z", "dt_bias", "rejected", "conv_bias"):
        if target[0] != name and data.draw(st.booleans(), label=f"drop {name}"):
            del args[name]
    expect_valid_call("verify", args)
    # (either pool may be fp32 or in the I/O dtype)
    aliased = corrupt_one_argument(data, args, FUSED_WRITTEN, target, **FUSED_EXEMPT,
                                   dtypes={"state": {"<f2"}, "conv_state": {"<f2", "<f4"}})
    expect_corrupted_call_refused("verify", args, target, aliased)
