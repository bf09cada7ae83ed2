"""The conv1d_verify launch plan on the CPU: a valid call binds every kernel parameter with the right grid and
variant; each bad input is refused with a typed error naming the argument, before the driver is touched."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors, runtime
from mamba2_aot.plans import PLANS
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (FakeDLPack, corrupt_one_argument, corruption_targets,  # noqa: F401
                           expect_corrupted_call_refused, expect_refused, expect_valid_call, fake_array,
                           no_driver)  # (no_driver: a fixture)

MB = 1 << 20

BATCH, T, CH, K, SLOTS, CAP = 3, 4, 200, 4, 16, 8
ELSEWHERE = 0x70000000  # a replacement array's address, clear of verify_args' arrays


def bf16_array(ptr, shape):
    """A bf16 fake (``__cuda_array_interface__`` cannot express bf16: a DLPack capsule, kDLBfloat 16)."""
    return FakeDLPack(ptr, shape, code=4, bits=16)


def conv_args(mode="update", **over):
    """Valid fake arguments (fp16 activations, fp32 pool), each array in its own megabyte."""
    base = iter(range(0x10000000, 0x40000000, MB))
    arr = lambda shape, dtype="fp16", strides=None: fake_array(next(base), shape, dtype, strides)  # noqa: E731
    args = dict(mode=mode, conv_state=arr((SLOTS, CH, K - 1), "fp32"), xBC=arr((BATCH, T, CH)),
                conv_weight=arr((CH, K), "fp32"), out=arr((BATCH, T, CH)), state_indices=arr((BATCH,), "int32"),
                conv_bias=arr((CH,), "fp32"), activation="silu", rejected=arr((1,), "int32"))
    if mode == "snapshot":
        args["snapshot_indices"] = arr((BATCH, T), "int32")
    if mode == "compact":
        args.update(num_accepted=arr((BATCH,), "int32"), conv_window_count=arr((SLOTS,), "int32"),
                    conv_window_xBC=arr((SLOTS, CAP, CH)), tickets=arr((SLOTS,), "int32"))
    args.update(over)
    return args


def bind(**args):
    plan = PLANS["conv1d_verify"]
    return plan.bind(**{k: as_device_array(v, k) if k in plan.arrays and v is not None else v
                        for k, v in args.items()})


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_valid_call_binds_every_parameter(mode):
    call = bind(**conv_args(mode))
    plan = PLANS["conv1d_verify"]
    assert set(call.params) == set(plan.param_names)
    assert call.grid == (2, BATCH, 1)  # ceil(200 / 128) CTAs of channels per request
    assert call.constants == {"mode": mode, "io_dtype": "fp16", "pool_dtype": "fp32"}
    p = call.params
    assert (p["batch"], p["seqlen"], p["channels"], p["width"], p["num_slots"]) == (BATCH, T, CH, K, SLOTS)
    assert p["window_capacity"] == (CAP if mode == "compact" else 0)
    assert (p["has_conv_bias"], p["silu"], p["has_rejected"]) == (1, 1, 1)
    # element strides, as the kernel indexes
    assert (p["stride_conv_state_slot"], p["stride_conv_state_channel"], p["stride_conv_state_tap"]) == \
        (CH * (K - 1), K - 1, 1)
    # what the mode does not use is a null pointer with zero strides
    unused = {"update": ("snapshot_indices", "num_accepted", "conv_window_count", "conv_window_xBC", "tickets"),
              "snapshot": ("num_accepted", "conv_window_count", "conv_window_xBC", "tickets"),
              "compact": ("snapshot_indices",)}[mode]
    for name in unused:
        assert p[name] == 0 and all(v == 0 for k, v in p.items() if k.startswith(f"stride_{name}_")), name
    if mode == "compact":  # the window record and the tickets are written: outputs, never inputs
        assert {a.name for a in call.outputs} >= {"conv_window_count", "conv_window_xBC", "tickets", "conv_state"}


@pytest.mark.parametrize("channels,blocks", [(1, 1), (128, 1), (129, 2), (200, 2), (128 * 64 + 2 * 8 * 128, 80)])
def test_grid_is_one_cta_per_128_channels_and_request(channels, blocks):
    call = bind(**conv_args(xBC=fake_array(ELSEWHERE, (BATCH, T, channels), "fp16"),
                            out=fake_array(ELSEWHERE + 64 * MB, (BATCH, T, channels), "fp16"),
                            conv_weight=fake_array(ELSEWHERE + 128 * MB, (channels, K), "fp32"),
                            conv_bias=fake_array(ELSEWHERE + 160 * MB, (channels,), "fp32"),
                            conv_state=fake_array(ELSEWHERE + 192 * MB, (SLOTS, channels, K - 1), "fp32")))
    assert call.grid == (blocks, BATCH, 1)


@pytest.mark.parametrize("pool", ["bf16", "fp32"])
def test_bf16_io_selects_the_bf16_variant(pool):
    """The built (ci) variants: bf16 I/O on a bf16 or an fp32 pool."""
    state = (bf16_array(ELSEWHERE, (SLOTS, CH, K - 1)) if pool == "bf16"
             else fake_array(ELSEWHERE, (SLOTS, CH, K - 1), "fp32"))
    call = bind(**conv_args("compact", xBC=bf16_array(ELSEWHERE + 8 * MB, (BATCH, T, CH)),
                            out=bf16_array(ELSEWHERE + 16 * MB, (BATCH, T, CH)),
                            conv_window_xBC=bf16_array(ELSEWHERE + 24 * MB, (SLOTS, CAP, CH)), conv_state=state))
    assert call.constants == {"mode": "compact", "io_dtype": "bf16", "pool_dtype": pool}


@pytest.mark.parametrize("width", [2, 3])
def test_options_bind_their_flags(width):
    call = bind(**conv_args(conv_weight=fake_array(ELSEWHERE, (CH, width), "fp32"), conv_bias=None,
                            activation=None, rejected=None,
                            conv_state=fake_array(ELSEWHERE + MB, (SLOTS, CH, width - 1), "fp32")))
    p = call.params
    assert p["width"] == width and (p["has_conv_bias"], p["silu"], p["has_rejected"]) == (0, 0, 0)
    assert p["conv_bias"] == 0 and p["stride_conv_bias_channel"] == 0 and p["rejected"] == 0


def test_compact_accepts_a_commit_without_new_rows():
    """T = 0 in compact mode only folds the accepted rows (and still launches: the count is rewritten)."""
    call = bind(**conv_args("compact", xBC=fake_array(ELSEWHERE, (BATCH, 0, CH), "fp16"),
                            out=fake_array(ELSEWHERE + MB, (BATCH, 0, CH), "fp16")))
    assert call.grid == (2, BATCH, 1) and call.params["seqlen"] == 0


def test_strided_views_record_their_strides():
    """xBC sliced from a fused projection, a pool with padded slots: any strides (element units)."""
    wide = fake_array(ELSEWHERE, (BATCH, T, CH), "fp16", strides=(T * 3 * CH, 3 * CH, 1))
    pool = fake_array(ELSEWHERE + 8 * MB, (SLOTS, CH, K - 1), "fp32", strides=(CH * K * 2, K, 1))
    p = bind(**conv_args(xBC=wide, conv_state=pool)).params
    assert (p["stride_xBC_batch"], p["stride_xBC_seqlen"], p["stride_xBC_channel"]) == (T * 3 * CH, 3 * CH, 1)
    assert (p["stride_conv_state_slot"], p["stride_conv_state_channel"]) == (CH * K * 2, K)


def _fp16(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "fp16")


def _i32(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "int32")


# (mode, change, error, argument, message fragment)
BAD = [
    ("update", {"mode": "decode"}, errors.InvalidArgumentError, "mode", "expected one of"),
    # dtypes
    ("update", {"xBC": fake_array(ELSEWHERE, (BATCH, T, CH), "int32")}, errors.DTypeError, "xBC",
     "expected dtype bf16 or fp16 or fp32, got int32"),
    ("update", {"out": fake_array(ELSEWHERE, (BATCH, T, CH), "fp32")}, errors.DTypeError, "out",
     "expected dtype fp16, got fp32"),
    ("update", {"conv_weight": _fp16((CH, K))}, errors.DTypeError, "conv_weight", "expected dtype fp32"),
    ("update", {"conv_bias": _fp16((CH,))}, errors.DTypeError, "conv_bias", "expected dtype fp32"),
    ("update", {"conv_state": _i32((SLOTS, CH, K - 1))}, errors.DTypeError, "conv_state",
     "expected dtype fp16 or fp32, got int32"),
    ("update", {"state_indices": fake_array(ELSEWHERE, (BATCH,), "int64")}, errors.DTypeError, "state_indices",
     "int32"),
    ("update", {"rejected": fake_array(ELSEWHERE, (1,), "int64")}, errors.DTypeError, "rejected", "int32"),
    ("snapshot", {"snapshot_indices": fake_array(ELSEWHERE, (BATCH, T), "int64")}, errors.DTypeError,
     "snapshot_indices", "int32"),
    ("compact", {"num_accepted": fake_array(ELSEWHERE, (BATCH,), "fp32")}, errors.DTypeError, "num_accepted",
     "int32"),
    ("compact", {"conv_window_count": fake_array(ELSEWHERE, (SLOTS,), "int64")}, errors.DTypeError,
     "conv_window_count", "int32"),
    ("compact", {"conv_window_xBC": fake_array(ELSEWHERE, (SLOTS, CAP, CH), "fp32")}, errors.DTypeError,
     "conv_window_xBC", "expected dtype fp16, got fp32"),
    ("compact", {"tickets": fake_array(ELSEWHERE, (SLOTS,), "fp32")}, errors.DTypeError, "tickets", "int32"),
    # the conv: width 2..4, weights and pool agree on it and on the channels
    ("update", {"conv_weight": fake_array(ELSEWHERE, (CH, 1), "fp32"),
                "conv_state": fake_array(ELSEWHERE + MB, (SLOTS, CH, 0), "fp32")},
     errors.ShapeError, "conv_weight", "width (dim 1) = 1 must be in 2..4"),
    ("update", {"conv_weight": fake_array(ELSEWHERE, (CH, 5), "fp32"),
                "conv_state": fake_array(ELSEWHERE + MB, (SLOTS, CH, 4), "fp32")},
     errors.ShapeError, "conv_weight", "width (dim 1) = 5 must be in 2..4"),
    ("update", {"conv_weight": fake_array(ELSEWHERE, (CH + 1, K), "fp32")}, errors.ShapeError, "conv_weight",
     f"expected shape {(CH, K)}"),
    ("update", {"conv_weight": fake_array(ELSEWHERE, (CH,), "fp32")}, errors.ShapeError, "conv_weight",
     "expected 2 dims"),
    ("update", {"conv_bias": fake_array(ELSEWHERE, (CH + 1,), "fp32")}, errors.ShapeError, "conv_bias",
     f"expected shape {(CH,)}"),
    ("update", {"conv_state": fake_array(ELSEWHERE, (SLOTS, CH, K), "fp32")}, errors.ShapeError, "conv_state",
     "(num_slots, channels, width - 1)"),  # K taps instead of K-1
    ("update", {"conv_state": fake_array(ELSEWHERE, (SLOTS, CH - 1, K - 1), "fp32")}, errors.ShapeError,
     "conv_state", f"expected shape {(SLOTS, CH, K - 1)}"),
    ("update", {"conv_state": fake_array(ELSEWHERE, (SLOTS, CH, K - 1), "fp32", strides=(0, K - 1, 1))},
     errors.StrideError, "conv_state", "slot stride 0"),
    ("update", {"activation": "relu"}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    ("update", {"activation": "SiLU"}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    ("update", {"activation": True}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    # rows and outputs
    ("update", {"xBC": _fp16((BATCH, T))}, errors.ShapeError, "xBC", "expected 3 dims"),
    ("update", {"xBC": _fp16((BATCH, 0, CH)), "out": _fp16((BATCH, 0, CH), MB)}, errors.ShapeError, "xBC",
     f"T (dim 1) must be >= 1, got shape {(BATCH, 0, CH)}"),
    ("snapshot", {"xBC": _fp16((BATCH, 0, CH)), "out": _fp16((BATCH, 0, CH), MB),
                  "snapshot_indices": _i32((BATCH, 0), 2 * MB)}, errors.ShapeError, "xBC", "must be >= 1"),
    ("update", {"out": _fp16((BATCH, T + 1, CH))}, errors.ShapeError, "out", f"expected shape {(BATCH, T, CH)}"),
    ("update", {"out": _fp16((BATCH, T, CH + 1))}, errors.ShapeError, "out", f"expected shape {(BATCH, T, CH)}"),
    ("update", {"out": None}, errors.ArrayProtocolError, "out", "required, got None"),
    ("update", {"conv_state": None}, errors.ArrayProtocolError, "conv_state", "required, got None"),
    ("update", {"state_indices": _i32((BATCH + 1,))}, errors.ShapeError, "state_indices", f"{(BATCH,)}"),
    ("update", {"rejected": _i32((2,))}, errors.ShapeError, "rejected",
     "expected shape (1,) (one int32 counter), got (2,)"),
    # the mode's arrays: required by it, refused by the others
    ("snapshot", {"snapshot_indices": None}, errors.InvalidArgumentError, "snapshot_indices",
     "required in snapshot mode"),
    ("snapshot", {"snapshot_indices": _i32((BATCH, T + 1))}, errors.ShapeError, "snapshot_indices",
     f"expected shape {(BATCH, T)}"),
    ("update", {"snapshot_indices": _i32((BATCH, T))}, errors.InvalidArgumentError, "snapshot_indices",
     "not used in update mode"),
    ("compact", {"snapshot_indices": _i32((BATCH, T))}, errors.InvalidArgumentError, "snapshot_indices",
     "not used in compact mode"),
    ("update", {"num_accepted": _i32((BATCH,))}, errors.InvalidArgumentError, "num_accepted",
     "not used in update mode"),
    ("snapshot", {"tickets": _i32((SLOTS,))}, errors.InvalidArgumentError, "tickets", "not used in snapshot mode"),
    ("update", {"conv_window_xBC": _fp16((SLOTS, CAP, CH))}, errors.InvalidArgumentError, "conv_window_xBC",
     "not used in update mode"),
    ("snapshot", {"conv_window_count": _i32((SLOTS,))}, errors.InvalidArgumentError, "conv_window_count",
     "not used in snapshot mode"),
] + [
    ("compact", {name: None}, errors.InvalidArgumentError, name, "required in compact mode")
    for name in ("num_accepted", "conv_window_count", "conv_window_xBC", "tickets")
] + [
    # the window record: per slot, in the I/O dtype, T new rows must fit
    ("compact", {"xBC": _fp16((BATCH, CAP + 1, CH)), "out": _fp16((BATCH, CAP + 1, CH), MB)}, errors.ShapeError,
     "xBC", f"T = {CAP + 1} new rows exceed the window capacity {CAP}"),
    ("compact", {"num_accepted": _i32((BATCH + 1,))}, errors.ShapeError, "num_accepted", f"{(BATCH,)}"),
    ("compact", {"conv_window_count": _i32((SLOTS + 1,))}, errors.ShapeError, "conv_window_count",
     f"expected shape {(SLOTS,)}"),
    ("compact", {"conv_window_xBC": _fp16((SLOTS - 1, CAP, CH))}, errors.ShapeError, "conv_window_xBC",
     f"expected shape {(SLOTS, CAP, CH)}"),
    ("compact", {"conv_window_xBC": _fp16((SLOTS, CAP, CH - 1))}, errors.ShapeError, "conv_window_xBC",
     f"expected shape {(SLOTS, CAP, CH)}"),
    ("compact", {"conv_window_xBC": _fp16((SLOTS, CAP))}, errors.ShapeError, "conv_window_xBC", "expected 3 dims"),
    ("compact", {"tickets": _i32((SLOTS - 1,))}, errors.ShapeError, "tickets", f"expected shape {(SLOTS,)}"),
] + [
    # dims the kernel takes as 32-bit ints: refused by name, not a struct.error when the parameters are packed
    ("update", {"conv_state": fake_array(ELSEWHERE, (2**31, CH, K - 1), "fp32")}, errors.ShapeError, "conv_state",
     f"num_slots (dim 0) = {2**31} exceeds the kernel's limit"),
    ("update", {"xBC": _fp16((1, 2**31, CH)), "out": _fp16((1, 2**31, CH), MB)}, errors.ShapeError, "xBC",
     f"T (dim 1) = {2**31} exceeds the kernel's limit"),
    ("compact", {"conv_window_xBC": _fp16((SLOTS, 2**31, CH))}, errors.ShapeError, "conv_window_xBC",
     f"capacity (dim 1) = {2**31} exceeds the kernel's limit"),
]


@pytest.mark.parametrize("mode,change,error,argument,fragment", BAD)
def test_refused_calls_name_the_argument_and_never_reach_the_driver(no_driver, mode, change, error,  # noqa: F811
                                                                    argument, fragment):
    expect_refused("conv1d_verify", {**conv_args(mode), **change}, error, argument, fragment)


def test_pool_in_another_half_precision_than_the_rows_is_refused(no_driver):  # noqa: F811
    """A conv pool holds raw inputs exactly: in the I/O dtype or fp32, never a third dtype."""
    rows = {"xBC": bf16_array(ELSEWHERE, (BATCH, T, CH)), "out": bf16_array(ELSEWHERE + MB, (BATCH, T, CH))}
    expect_refused("conv1d_verify", conv_args(**rows, conv_state=fake_array(ELSEWHERE + 2 * MB, (SLOTS, CH, K - 1),
                                                                             "fp16")),
                   errors.DTypeError, "conv_state", "expected dtype bf16 or fp32, got fp16")
    # and the window record holds the rows as they are: in the I/O dtype only
    expect_refused("conv1d_verify", conv_args("compact", **rows,
                                              conv_window_xBC=fake_array(ELSEWHERE + 2 * MB, (SLOTS, CAP, CH), "fp16")),
                   errors.DTypeError, "conv_window_xBC", "expected dtype bf16, got fp16")


def test_outputs_sharing_memory_are_refused(no_driver):  # noqa: F811
    args = conv_args()
    expect_refused("conv1d_verify", {**args, "out": args["xBC"]}, errors.AliasingError, "out", "overlaps xBC")
    args = conv_args("compact")
    expect_refused("conv1d_verify", {**args, "tickets": args["conv_window_count"]}, errors.AliasingError, "tickets",
                   "overlaps conv_window_count")


def test_unknown_keyword_names_it(no_driver):  # noqa: F811
    """verify's window argument names are not conv1d_verify's."""
    args = conv_args("compact")
    args["window_count"] = args.pop("conv_window_count")
    with pytest.raises(errors.InvalidArgumentError, match="^window_count: not an argument of conv1d_verify "
                       r"\(did you mean 'conv_window_count'\?\)") as info:
        runtime.launch("conv1d_verify", stream=0, **args)
    assert info.value.argument == "window_count"


MODES = ("update", "snapshot", "compact")
CONV_WRITTEN = ("out", "conv_state", "rejected", "conv_window_count", "conv_window_xBC", "tickets")  # (by any mode)
# (the kernel takes any stride along the last dim of every array)
ANY_LAST_STRIDE = tuple({name for mode in MODES for name in conv_args(mode)})


@pytest.mark.parametrize("target", corruption_targets([conv_args(mode) for mode in MODES], CONV_WRITTEN,
                                                      free_last_stride=ANY_LAST_STRIDE), ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid call (mode and options drawn) with one array made wrong (each argument, each way): a typed refusal
    naming one of the call's arguments (the one made wrong, where nothing else can be), and the driver never
    opened."""
    mode = data.draw(st.sampled_from([m for m in MODES if target[0] in conv_args(m)]), label="mode")
    args = conv_args(mode)
    for name in ("conv_bias", "rejected"):
        if target[0] != name and data.draw(st.booleans(), label=f"drop {name}"):
            del args[name]
    expect_valid_call("conv1d_verify", args)
    # (a pool may be fp32 or in the I/O dtype; without window records, it may have any number of slots; the window
    # record's capacity is its own)
    aliased = corrupt_one_argument(data, args, CONV_WRITTEN, target, dtypes={"conv_state": {"<f2"}},
                                   free_dims={"conv_state": {0}} if mode != "compact" else {"conv_window_xBC": {1}},
                                   free_last_stride=ANY_LAST_STRIDE)
    expect_corrupted_call_refused("conv1d_verify", args, target, aliased)
