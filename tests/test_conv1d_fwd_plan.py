"""The conv1d_fwd launch plan on the CPU: a valid call binds every kernel parameter with the right grid and
variant (one CTA per 128 channels, 64 tokens and row; the pool dtype is the state arrays' dtype, else the I/O
dtype); each bad input is refused with a typed error naming the argument, before the driver is touched."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors, runtime
from mamba2_aot.plans import PLANS
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (corrupt_one_argument, corruption_targets, expect_corrupted_call_refused,  # noqa: F401
                           expect_refused, expect_valid_call, fake_array, no_driver)  # (no_driver: a fixture)
from test_conv1d_verify_plan import bf16_array

MB = 1 << 20

BATCH, L, CH, K, NSEQ, SLOTS = 3, 300, 200, 4, 5, 16
ELSEWHERE = 0x70000000  # a replacement array's address, clear of the arrays of fwd_args / packed_args
STATE_ARRAYS = ("initial_states", "initial_state_indices", "final_states", "final_state_indices")


def _arrays():
    """A fake-array factory handing each array its own megabyte."""
    base = iter(range(0x10000000, 0x40000000, MB))
    return lambda shape, dtype="fp16", strides=None: fake_array(next(base), shape, dtype, strides)  # noqa: E731


def fwd_args(**over):
    """Valid fake arguments, one sequence per row (fp16 rows: the CAI fakes have no bf16; fp32 states given as
    (num_seqs, channels, K-1) arrays, no indices)."""
    arr = _arrays()
    args = dict(xBC=arr((BATCH, L, CH)), conv_weight=arr((CH, K), "fp32"), out=arr((BATCH, L, CH)),
                conv_bias=arr((CH,), "fp32"), activation="silu", initial_states=arr((BATCH, CH, K - 1), "fp32"),
                final_states=arr((BATCH, CH, K - 1), "fp32"))
    args.update(over)
    return args


def packed_args(**over):
    """Valid fake arguments, NSEQ sequences packed along L of one row (cu_seqlens), states in fp32 pools of
    SLOTS slots read and written through index arrays."""
    arr = _arrays()
    args = dict(xBC=arr((1, L, CH)), conv_weight=arr((CH, K), "fp32"), out=arr((1, L, CH)),
                conv_bias=arr((CH,), "fp32"), activation="silu", cu_seqlens=arr((NSEQ + 1,), "int32"),
                initial_states=arr((SLOTS, CH, K - 1), "fp32"), initial_state_indices=arr((NSEQ,), "int32"),
                final_states=arr((SLOTS, CH, K - 1), "fp32"), final_state_indices=arr((NSEQ,), "int32"))
    args.update(over)
    return args


def bind(**args):
    plan = PLANS["conv1d_fwd"]
    return plan.bind(**{k: as_device_array(v, k) if k in plan.arrays and v is not None else v
                        for k, v in args.items()})


def _is_null(params, name):
    return params[name] == 0 and all(v == 0 for k, v in params.items() if k.startswith(f"stride_{name}_"))


def test_valid_call_binds_every_parameter():
    args = fwd_args()
    call = bind(**args)
    plan = PLANS["conv1d_fwd"]
    assert set(call.params) == set(plan.param_names)
    assert call.grid == (2, 5, BATCH)  # ceil(200 / 128) channel CTAs, ceil(300 / 64) token CTAs, one per row
    assert call.constants == {"io_dtype": "fp16", "pool_dtype": "fp32"}
    p = call.params
    assert (p["batch"], p["seqlen"], p["channels"], p["width"], p["num_seqs"]) == (BATCH, L, CH, K, BATCH)
    assert (p["num_initial_slots"], p["num_final_slots"]) == (BATCH, BATCH)
    assert (p["has_conv_bias"], p["silu"], p["has_initial_states"], p["has_final_states"]) == (1, 1, 1, 1)
    assert (p["has_initial_state_indices"], p["has_final_state_indices"], p["has_seq_idx"],
            p["has_cu_seqlens"]) == (0, 0, 0, 0)
    for name in ("xBC", "conv_weight", "conv_bias", "out", "initial_states", "final_states"):
        assert p[name] == args[name].__cuda_array_interface__["data"][0], name
    # element strides, as the kernel indexes
    assert (p["stride_xBC_batch"], p["stride_xBC_seqlen"], p["stride_xBC_channel"]) == (L * CH, CH, 1)
    assert (p["stride_out_batch"], p["stride_out_seqlen"], p["stride_out_channel"]) == (L * CH, CH, 1)
    assert (p["stride_conv_weight_channel"], p["stride_conv_weight_tap"], p["stride_conv_bias_channel"]) == (K, 1, 1)
    for role in ("initial", "final"):
        assert (p[f"stride_{role}_states_slot"], p[f"stride_{role}_states_channel"],
                p[f"stride_{role}_states_tap"]) == (CH * (K - 1), K - 1, 1)
    # what the call does not pass is a null pointer with zero strides
    for name in ("seq_idx", "cu_seqlens", "initial_state_indices", "final_state_indices"):
        assert _is_null(p, name), name
    assert {a.name for a in call.inputs} == {"xBC", "conv_weight", "conv_bias", "initial_states"}
    assert {a.name for a in call.outputs} == {"out", "final_states"}


def test_packed_call_with_pools_binds_the_slots_and_indices():
    args = packed_args()
    call = bind(**args)
    p = call.params
    assert call.grid == (2, 5, 1)
    assert call.constants == {"io_dtype": "fp16", "pool_dtype": "fp32"}
    assert (p["num_seqs"], p["num_initial_slots"], p["num_final_slots"]) == (NSEQ, SLOTS, SLOTS)
    assert (p["has_cu_seqlens"], p["has_seq_idx"], p["has_initial_state_indices"],
            p["has_final_state_indices"]) == (1, 0, 1, 1)
    for name in ("cu_seqlens", "initial_state_indices", "final_state_indices"):
        assert p[name] == args[name].__cuda_array_interface__["data"][0], name
    assert (p["stride_cu_seqlens_seq"], p["stride_initial_state_indices_seq"],
            p["stride_final_state_indices_seq"]) == (1, 1, 1)
    assert _is_null(p, "seq_idx")
    assert {a.name for a in call.inputs} >= {"cu_seqlens", "initial_state_indices", "final_state_indices",
                                             "initial_states"}
    assert {a.name for a in call.outputs} == {"out", "final_states"}


def test_packed_call_with_per_sequence_arrays():
    """cu_seqlens with (num_seqs, channels, K-1) states and no indices: one state per sequence, not per row."""
    call = bind(**packed_args(initial_states=fake_array(ELSEWHERE, (NSEQ, CH, K - 1), "fp16"),
                              final_states=fake_array(ELSEWHERE + MB, (NSEQ, CH, K - 1), "fp16"),
                              initial_state_indices=None, final_state_indices=None))
    p = call.params
    assert call.constants == {"io_dtype": "fp16", "pool_dtype": "fp16"}
    assert (p["num_seqs"], p["num_initial_slots"], p["num_final_slots"]) == (NSEQ, NSEQ, NSEQ)
    assert _is_null(p, "initial_state_indices") and _is_null(p, "final_state_indices")


def test_seq_idx_without_states_binds():
    seq_idx = fake_array(ELSEWHERE, (BATCH, L), "int32", strides=(L + 8, 1))
    call = bind(**fwd_args(initial_states=None, final_states=None, seq_idx=seq_idx))
    p = call.params
    assert p["has_seq_idx"] == 1 and p["seq_idx"] == ELSEWHERE
    assert (p["stride_seq_idx_batch"], p["stride_seq_idx_seqlen"]) == (L + 8, 1)
    assert p["num_seqs"] == BATCH and p["has_cu_seqlens"] == 0
    for name in STATE_ARRAYS:
        assert _is_null(p, name) and p[f"has_{name}"] == 0, name
    assert (p["num_initial_slots"], p["num_final_slots"]) == (0, 0)
    assert call.constants == {"io_dtype": "fp16", "pool_dtype": "fp16"}  # no states: the I/O dtype
    assert "seq_idx" in {a.name for a in call.inputs}


@pytest.mark.parametrize("channels,L_,grid", [
    (1, 1, (1, 1)), (128, 63, (1, 1)), (129, 64, (2, 1)), (200, 65, (2, 2)), (200, 200, (2, 4)),
    (128 * 64 + 2 * 8 * 128, 128, (80, 2)),   # Nemotron-H-like xBC: 10240 channels
])
@pytest.mark.parametrize("batch", [1, 3])
def test_grid_is_one_cta_per_128_channels_64_tokens_and_row(channels, L_, grid, batch):
    call = bind(xBC=fake_array(ELSEWHERE, (batch, L_, channels), "fp16"),
                out=fake_array(ELSEWHERE + 16 * MB, (batch, L_, channels), "fp16"),
                conv_weight=fake_array(ELSEWHERE + 32 * MB, (channels, K), "fp32"))
    assert call.grid == (*grid, batch)
    assert call.params["seqlen"] == L_ and call.params["channels"] == channels


@pytest.mark.parametrize("initial,final,pool", [
    (None, None, "bf16"),      # no states: the I/O dtype
    ("bf16", "bf16", "bf16"), ("fp32", "fp32", "fp32"),
    ("fp32", None, "fp32"), (None, "bf16", "bf16"), (None, "fp32", "fp32"),
])
def test_bf16_rows_select_the_pool_variant_from_the_states(initial, final, pool):
    """The built (ci) variants: bf16 I/O on a bf16 or an fp32 pool; the pool dtype is the states'."""
    def state(dtype, offset):
        if dtype is None:
            return None
        if dtype == "bf16":
            return bf16_array(ELSEWHERE + offset, (BATCH, CH, K - 1))
        return fake_array(ELSEWHERE + offset, (BATCH, CH, K - 1), dtype)

    call = bind(**fwd_args(xBC=bf16_array(ELSEWHERE + 8 * MB, (BATCH, L, CH)),
                           out=bf16_array(ELSEWHERE + 16 * MB, (BATCH, L, CH)),
                           initial_states=state(initial, 0), final_states=state(final, MB)))
    assert call.constants == {"io_dtype": "bf16", "pool_dtype": pool}
    p = call.params
    assert (p["has_initial_states"], p["has_final_states"]) == (int(initial is not None), int(final is not None))


@pytest.mark.parametrize("width", [2, 3])
def test_options_bind_their_flags(width):
    call = bind(**fwd_args(conv_weight=fake_array(ELSEWHERE, (CH, width), "fp32"), conv_bias=None, activation=None,
                           initial_states=fake_array(ELSEWHERE + MB, (BATCH, CH, width - 1), "fp32"),
                           final_states=None))
    p = call.params
    assert p["width"] == width and (p["has_conv_bias"], p["silu"], p["has_final_states"]) == (0, 0, 0)
    assert _is_null(p, "conv_bias") and _is_null(p, "final_states")
    assert p["num_final_slots"] == 0 and p["num_initial_slots"] == BATCH
    assert {a.name for a in call.outputs} == {"out"}


def test_pool_in_place_is_read_and_written_not_an_aliasing_error():
    """initial_states is final_states: one pool, read in place (an output only, so no overlap with itself)."""
    pool = fake_array(ELSEWHERE, (SLOTS, CH, K - 1), "fp32")
    idx = fake_array(ELSEWHERE + 8 * MB, (NSEQ,), "int32")
    call = bind(**packed_args(initial_states=pool, final_states=pool, initial_state_indices=idx,
                              final_state_indices=idx))
    p = call.params
    assert p["initial_states"] == p["final_states"] == ELSEWHERE
    assert p["initial_state_indices"] == p["final_state_indices"] == ELSEWHERE + 8 * MB
    assert (p["num_initial_slots"], p["num_final_slots"]) == (SLOTS, SLOTS)
    assert all(a.name != "initial_states" for a in call.inputs)
    assert "final_states" in {a.name for a in call.outputs}


def test_strided_views_record_their_strides():
    """xBC and out sliced from wider rows, a transposed weight, a pool with padded slots and taps (element
    units, any strides)."""
    wide = fake_array(ELSEWHERE, (BATCH, L, CH), "fp16", strides=(L * 3 * CH, 3 * CH, 1))
    out = fake_array(ELSEWHERE + 8 * MB, (BATCH, L, CH), "fp16", strides=(L * (CH + 8), CH + 8, 1))
    weight_t = fake_array(ELSEWHERE + 16 * MB, (CH, K), "fp32", strides=(1, CH))
    pool = fake_array(ELSEWHERE + 17 * MB, (SLOTS, CH, K - 1), "fp32", strides=(2 * CH * K, K, 1))
    idx = fake_array(ELSEWHERE + 18 * MB, (BATCH,), "int32", strides=(2,))
    p = bind(**fwd_args(xBC=wide, out=out, conv_weight=weight_t, initial_states=pool, final_states=pool,
                        initial_state_indices=idx, final_state_indices=idx)).params
    assert (p["stride_xBC_batch"], p["stride_xBC_seqlen"], p["stride_xBC_channel"]) == (L * 3 * CH, 3 * CH, 1)
    assert (p["stride_out_batch"], p["stride_out_seqlen"]) == (L * (CH + 8), CH + 8)
    assert (p["stride_conv_weight_channel"], p["stride_conv_weight_tap"]) == (1, CH)
    assert (p["stride_initial_states_slot"], p["stride_initial_states_channel"],
            p["stride_initial_states_tap"]) == (2 * CH * K, K, 1)
    assert (p["stride_final_states_slot"], p["stride_final_states_channel"]) == (2 * CH * K, K)
    assert p["stride_initial_state_indices_seq"] == p["stride_final_state_indices_seq"] == 2


def test_workspace_is_zero():
    assert runtime.workspace_size("conv1d_fwd", **fwd_args()) == 0


def _fp16(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "fp16")


def _fp32(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "fp32")


def _i32(shape, offset=0):
    return fake_array(ELSEWHERE + offset, shape, "int32")


PACKED, ROWS = "packed", "rows"
# (base arguments, change, error, argument, message fragment)
BAD = [
    # packing: seq_idx or cu_seqlens; cu_seqlens packs one row; no per-sequence states with seq_idx
    (PACKED, {"seq_idx": _i32((1, L))}, errors.InvalidArgumentError, "seq_idx", "not both"),
    (ROWS, {"cu_seqlens": _i32((BATCH + 1,)), "initial_states": None, "final_states": None}, errors.ShapeError,
     "xBC", "cu_seqlens packs sequences along L and needs batch == 1, got 3"),
    (ROWS, {"seq_idx": _i32((BATCH, L))}, errors.InvalidArgumentError, "initial_states",
     "per-sequence conv states with seq_idx are not supported"),
    (ROWS, {"seq_idx": _i32((BATCH, L)), "initial_states": None}, errors.InvalidArgumentError, "final_states",
     "per-sequence conv states with seq_idx are not supported"),
    (PACKED, {"cu_seqlens": None, "seq_idx": _i32((1, L))}, errors.InvalidArgumentError, "initial_states",
     "pack with cu_seqlens instead"),
    (ROWS, {"seq_idx": _i32((BATCH, L + 1)), "initial_states": None, "final_states": None}, errors.ShapeError,
     "seq_idx", f"expected shape {(BATCH, L)}"),
    (ROWS, {"seq_idx": fake_array(ELSEWHERE, (BATCH, L), "int64"), "initial_states": None, "final_states": None},
     errors.DTypeError, "seq_idx", "int32"),
    (PACKED, {"cu_seqlens": fake_array(ELSEWHERE, (NSEQ + 1,), "int64")}, errors.DTypeError, "cu_seqlens", "int32"),
    (PACKED, {"cu_seqlens": _i32((1,))}, errors.ShapeError, "cu_seqlens", "at least 2 entries"),
    (PACKED, {"cu_seqlens": _i32((1, NSEQ + 1))}, errors.ShapeError, "cu_seqlens", "expected 1 dims"),
    # one state dtype per call, the I/O dtype or fp32
    (ROWS, {"initial_states": _fp16((BATCH, CH, K - 1))}, errors.InvalidArgumentError, "final_states",
     "dtype fp32 differs from initial_states' fp16"),
    (PACKED, {"final_states": _fp16((SLOTS, CH, K - 1))}, errors.InvalidArgumentError, "final_states",
     "differs from initial_states"),
    (ROWS, {"initial_states": bf16_array(ELSEWHERE, (BATCH, CH, K - 1))}, errors.DTypeError, "initial_states",
     "expected dtype fp16 or fp32, got bf16"),
    (ROWS, {"initial_states": None, "final_states": bf16_array(ELSEWHERE, (BATCH, CH, K - 1))}, errors.DTypeError,
     "final_states", "expected dtype fp16 or fp32, got bf16"),
    (ROWS, {"initial_states": _i32((BATCH, CH, K - 1)), "final_states": None}, errors.DTypeError,
     "initial_states", "got int32"),
    # states: (num_seqs, channels, K-1) without indices, (num_slots, channels, K-1) with them
    (ROWS, {"initial_states": _fp32((BATCH + 1, CH, K - 1))}, errors.ShapeError, "initial_states",
     f"expected shape {(BATCH, CH, K - 1)} (num_seqs, channels, width - 1)"),
    (ROWS, {"final_states": _fp32((BATCH - 1, CH, K - 1))}, errors.ShapeError, "final_states",
     f"expected shape {(BATCH, CH, K - 1)}"),
    (PACKED, {"initial_states": _fp32((BATCH, CH, K - 1)), "initial_state_indices": None}, errors.ShapeError,
     "initial_states", f"expected shape {(NSEQ, CH, K - 1)} (num_seqs, channels, width - 1)"),
    (ROWS, {"initial_states": _fp32((BATCH, CH, K))}, errors.ShapeError, "initial_states",
     "(num_seqs or num_slots, channels, width - 1)"),   # K taps instead of K-1
    (ROWS, {"final_states": _fp32((BATCH, CH + 1, K - 1))}, errors.ShapeError, "final_states",
     "(num_seqs or num_slots, channels, width - 1)"),
    (PACKED, {"final_states": _fp32((SLOTS, CH, K - 2))}, errors.ShapeError, "final_states",
     f"expected shape {(SLOTS, CH, K - 1)}"),
    (ROWS, {"initial_states": _fp32((BATCH, CH * (K - 1)))}, errors.ShapeError, "initial_states",
     "expected 3 dims"),
    # indices: only with their states, int32, one per sequence
    (ROWS, {"initial_states": None, "initial_state_indices": _i32((BATCH,))}, errors.InvalidArgumentError,
     "initial_state_indices", "given without initial_states"),
    (PACKED, {"final_states": None}, errors.InvalidArgumentError, "final_state_indices",
     "given without final_states"),
    (PACKED, {"initial_state_indices": _i32((NSEQ + 1,))}, errors.ShapeError, "initial_state_indices",
     f"expected shape {(NSEQ,)} (num_seqs,)"),
    (PACKED, {"final_state_indices": _i32((NSEQ, 1))}, errors.ShapeError, "final_state_indices", "(num_seqs,)"),
    (ROWS, {"final_state_indices": _i32((NSEQ,))}, errors.ShapeError, "final_state_indices",
     f"expected shape {(BATCH,)}"),   # rows: one index per row
    (PACKED, {"initial_state_indices": fake_array(ELSEWHERE, (NSEQ,), "int64")}, errors.DTypeError,
     "initial_state_indices", "int32"),
    # rows and outputs
    (ROWS, {"xBC": _fp16((BATCH, 0, CH)), "out": _fp16((BATCH, 0, CH), MB)}, errors.ShapeError, "xBC",
     f"seqlen (dim 1) must be >= 1, got shape {(BATCH, 0, CH)}"),
    (PACKED, {"xBC": _fp16((1, 0, CH)), "out": _fp16((1, 0, CH), MB)}, errors.ShapeError, "xBC", "must be >= 1"),
    (ROWS, {"xBC": _fp16((1, 64 * 65535 + 1, 1)), "out": _fp16((1, 64 * 65535 + 1, 1), 16 * MB),
            "conv_weight": _fp32((1, K), 32 * MB), "conv_bias": None, "initial_states": None, "final_states": None},
     errors.ShapeError, "xBC", "seqlen / 64 (grid y) = 65536 exceeds"),
    (ROWS, {"xBC": fake_array(ELSEWHERE, (BATCH, L, CH), "int32")}, errors.DTypeError, "xBC",
     "expected dtype bf16 or fp16 or fp32, got int32"),
    (ROWS, {"xBC": _fp16((BATCH, L))}, errors.ShapeError, "xBC", "expected 3 dims"),
    (ROWS, {"out": _fp32((BATCH, L, CH))}, errors.DTypeError, "out", "expected dtype fp16, got fp32"),
    (ROWS, {"out": _fp16((BATCH, L + 1, CH))}, errors.ShapeError, "out", f"expected shape {(BATCH, L, CH)}"),
    (ROWS, {"out": None}, errors.ArrayProtocolError, "out", "required, got None"),
    (ROWS, {"xBC": None}, errors.ArrayProtocolError, "xBC", "required, got None"),
    # the conv: width 2..4, weights and bias in fp32 over the channels, silu or nothing
    (ROWS, {"conv_weight": _fp32((CH, 1)), "initial_states": None, "final_states": None}, errors.ShapeError,
     "conv_weight", "width (dim 1) = 1 must be in 2..4"),
    (ROWS, {"conv_weight": _fp32((CH, 5)), "initial_states": _fp32((BATCH, CH, 4), MB),
            "final_states": _fp32((BATCH, CH, 4), 2 * MB)}, errors.ShapeError, "conv_weight",
     "width (dim 1) = 5 must be in 2..4"),
    (ROWS, {"conv_weight": _fp32((CH + 1, K))}, errors.ShapeError, "conv_weight", f"expected shape {(CH, K)}"),
    (ROWS, {"conv_weight": _fp16((CH, K))}, errors.DTypeError, "conv_weight", "expected dtype fp32"),
    (ROWS, {"conv_bias": _fp16((CH,))}, errors.DTypeError, "conv_bias", "expected dtype fp32"),
    (ROWS, {"conv_bias": _fp32((CH + 1,))}, errors.ShapeError, "conv_bias", f"expected shape {(CH,)}"),
    (ROWS, {"activation": "relu"}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    (ROWS, {"activation": "SiLU"}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    (ROWS, {"activation": True}, errors.InvalidArgumentError, "activation", "expected 'silu' or None"),
    # memory: outputs overlapping inputs; a written pool whose slots alias
    (ROWS, {"final_states": _fp32((BATCH, CH, K - 1), 0), "initial_states": None,
            "out": _fp16((BATCH, L, CH), 0)}, errors.AliasingError, "final_states", "overlaps out"),
    (PACKED, {"final_states": fake_array(ELSEWHERE, (SLOTS, CH, K - 1), "fp32", strides=(0, K - 1, 1))},
     errors.StrideError, "final_states", "make elements overlap"),
    # dims the kernel takes as 32-bit ints (a read-only pool may be a broadcast view of any length)
    (PACKED, {"initial_states": fake_array(ELSEWHERE, (2**31, CH, K - 1), "fp32", strides=(0, K - 1, 1))},
     errors.ShapeError, "initial_states", f"num_seqs or num_slots (dim 0) = {2**31} exceeds the kernel's limit"),
    (PACKED, {"cu_seqlens": _i32((2**31 + 1,))}, errors.ShapeError, "cu_seqlens",
     f"num_seqs (dim 0 - 1) = {2**31} exceeds the kernel's limit"),
]


@pytest.mark.parametrize("base,change,error,argument,fragment", BAD)
def test_refused_calls_name_the_argument_and_never_reach_the_driver(no_driver, base, change, error,  # noqa: F811
                                                                    argument, fragment):
    args = packed_args() if base == PACKED else fwd_args()
    expect_refused("conv1d_fwd", {**args, **change}, error, argument, fragment)


def test_bf16_rows_refuse_an_fp16_pool(no_driver):  # noqa: F811
    """A conv pool holds raw inputs exactly: in the I/O dtype or fp32, never another half precision."""
    rows = {"xBC": bf16_array(ELSEWHERE, (BATCH, L, CH)), "out": bf16_array(ELSEWHERE + MB, (BATCH, L, CH))}
    expect_refused("conv1d_fwd", fwd_args(**rows, initial_states=_fp16((BATCH, CH, K - 1), 2 * MB),
                                          final_states=None),
                   errors.DTypeError, "initial_states", "expected dtype bf16 or fp32, got fp16")


def test_outputs_sharing_memory_are_refused(no_driver):  # noqa: F811
    args = fwd_args()
    expect_refused("conv1d_fwd", {**args, "out": args["xBC"]}, errors.AliasingError, "out", "overlaps xBC")
    # two views of one pool that are not the same array: the written one overlaps the read one
    args = packed_args(initial_states=fake_array(ELSEWHERE, (SLOTS - 1, CH, K - 1), "fp32"),
                       final_states=fake_array(ELSEWHERE + CH * (K - 1) * 4, (SLOTS - 1, CH, K - 1), "fp32"))
    expect_refused("conv1d_fwd", args, errors.AliasingError, "final_states", "overlaps initial_states")


def test_unknown_keyword_names_it(no_driver):  # noqa: F811
    """conv1d_verify's pool argument is not conv1d_fwd's."""
    args = fwd_args()
    args["conv_state"] = args.pop("initial_states")
    with pytest.raises(errors.InvalidArgumentError, match="^conv_state: not an argument of conv1d_fwd") as info:
        runtime.launch("conv1d_fwd", stream=0, **args)
    assert info.value.argument == "conv_state"


FWD_WRITTEN = ("out", "final_states")
OPTIONAL_GROUPS = (("conv_bias",), ("initial_states", "initial_state_indices"), ("final_states", "final_state_indices"))
PACKINGS = {"rows": lambda: fwd_args(), "cu_seqlens": lambda: packed_args(),
            # (no conv states with seq_idx)
            "seq_idx": lambda: {k: v for k, v in fwd_args(seq_idx=fake_array(ELSEWHERE, (BATCH, L), "int32")).items()
                                if k not in STATE_ARRAYS}}
# (the kernel takes any stride along the last dim of every array)
ANY_LAST_STRIDE = tuple({name for make in PACKINGS.values() for name in make()})


@pytest.mark.parametrize("target", corruption_targets([make() for make in PACKINGS.values()], FWD_WRITTEN,
                                                      free_last_stride=ANY_LAST_STRIDE), ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid call (per-row states, packed sequences with pools, or seq_idx; options drawn) with one array made
    wrong (each argument, each way): a typed refusal naming one of the call's arguments (the one made wrong, where
    nothing else can be), and the driver never opened."""
    packing = data.draw(st.sampled_from([p for p, make in PACKINGS.items() if target[0] in make()]), label="packing")
    args = PACKINGS[packing]()
    for names in OPTIONAL_GROUPS:
        if target[0] not in names and data.draw(st.booleans(), label=f"drop {names}"):
            for name in names:
                args.pop(name, None)
    expect_valid_call("conv1d_fwd", args)
    # (states may be fp32 or in the I/O dtype, one dtype for both; a pool may have any number of slots; without
    # states, cu_seqlens may hold any number of sequences and the conv be of any width)
    lone_state = {"initial_states", "final_states"} - set(args)
    dtypes = {name: {"<f2", "<f4"} for name in ("initial_states", "final_states") if lone_state and name in args}
    free_dims = {"initial_states": {0}, "final_states": {0}} if packing == "cu_seqlens" else {}
    if not {"initial_states", "final_states"} & set(args):
        free_dims.update(conv_weight={1}, cu_seqlens={0})
    aliased = corrupt_one_argument(data, args, FWD_WRITTEN, target, dtypes=dtypes, free_dims=free_dims,
                                   in_place=[("initial_states", "final_states")], free_last_stride=ANY_LAST_STRIDE)
    expect_corrupted_call_refused("conv1d_fwd", args, target, aliased)
