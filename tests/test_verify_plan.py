"""The verify launch plan on the CPU: a valid call binds every kernel parameter; each bad input is refused
with a typed error naming the argument, before the driver is touched."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import errors, runtime
from mamba2_aot.plans import PLANS, CompositePlan
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (corrupt_one_argument, corruption_targets, expect_corrupted_call_refused,  # noqa: F401
                           expect_refused, expect_valid_call, fake_array, no_driver)  # (no_driver: a fixture)

MB = 1 << 20

BATCH, T, H, P, N, G, SLOTS, CAP = 3, 4, 8, 64, 128, 2, 16, 8


def verify_args(mode="update", **over):
    """Valid fake arguments (fp16 activations, fp32 pool), each array 8 MiB apart (the pool takes 4)."""
    base = iter(range(0x10000000, 0x40000000, 8 * MB))
    arr = lambda shape, dtype="fp16", strides=None: fake_array(next(base), shape, dtype, strides)  # noqa: E731
    args = dict(mode=mode, state=arr((SLOTS, H, P, N), "fp32"), x=arr((BATCH, T, H, P)), dt=arr((BATCH, T, H)),
                A=arr((H,), "fp32"), B=arr((BATCH, T, G, N)), C=arr((BATCH, T, G, N)), out=arr((BATCH, T, H, P)),
                state_indices=arr((BATCH,), "int32"), D=arr((H, P), "fp32"), z=arr((BATCH, T, H, P)),
                dt_bias=arr((H,), "fp32"), rejected=arr((1,), "int32"))
    if mode == "snapshot":
        args["snapshot_indices"] = arr((BATCH, T), "int32")
    if mode == "compact":
        args.update(num_accepted=arr((BATCH,), "int32"), window_count=arr((SLOTS, H), "int32"),
                    window_x=arr((SLOTS, CAP, H, P)), window_B=arr((SLOTS, CAP, H, N)), window_dt=arr((SLOTS, CAP, H)))
    args.update(over)
    return args


@pytest.mark.parametrize("mode", ["update", "snapshot", "compact"])
def test_valid_call_binds_every_parameter(mode):
    plan = PLANS["verify"]
    args = {k: as_device_array(v, k) if k in plan.arrays else v for k, v in verify_args(mode).items()}
    call = plan.bind(**args)
    assert set(call.params) == set(plan.param_names)
    # a small update / snapshot call runs its row passes in two CTAs (grid z); compact never splits
    assert call.grid == (H, BATCH, 1 if mode == "compact" else 2) and call.params["row_splits"] == call.grid[2]
    assert call.params["vector_rows"] == 1
    assert call.constants == {"mode": mode, "headdim": P, "d_state": N, "io_dtype": "fp16", "pool_dtype": "fp32",
                              "conv_dtype": "none"}
    assert call.params["heads_per_group"] == H // G and call.params["window_capacity"] == (CAP if mode == "compact"
                                                                                            else 0)
    assert call.params["stride_D_dim"] == 1 and call.params["has_z"] == 1


def bind(**over):
    plan = PLANS["verify"]
    return plan.bind(**{k: as_device_array(v, k) if k in plan.arrays else v for k, v in verify_args(**over).items()})


def test_calls_that_fill_the_gpu_run_one_cta_per_head_and_request():
    many = 132 // H + 1
    call = bind(x=fake_array(0x70000000, (many, T, H, P), "fp16"), dt=fake_array(0x71000000, (many, T, H), "fp16"),
                B=fake_array(0x72000000, (many, T, G, N), "fp16"), C=fake_array(0x73000000, (many, T, G, N), "fp16"),
                out=fake_array(0x74000000, (many, T, H, P), "fp16"), z=fake_array(0x75000000, (many, T, H, P), "fp16"),
                state_indices=fake_array(0x76000000, (many,), "int32"))
    assert call.grid == (H, many, 1) and call.params["row_splits"] == 1


def test_a_state_of_one_row_pass_is_not_split():
    call = bind(state=fake_array(0x70000000, (SLOTS, H, P, 64), "fp32"), B=fake_array(0x71000000, (BATCH, T, G, 64),
                "fp16"), C=fake_array(0x72000000, (BATCH, T, G, 64), "fp16"))
    assert call.grid == (H, BATCH, 1) and call.params["row_splits"] == 1


@pytest.mark.parametrize("name, array", [
    ("x", fake_array(0x70000002, (BATCH, T, H, P), "fp16")),                           # base off 16 bytes
    ("B", fake_array(0x70000000, (BATCH, T, G, N), "fp16", (T * G * (N + 4), G * (N + 4), N + 4, 1))),
    ("window_x", fake_array(0x70000000, (SLOTS, CAP, H, P), "fp16", (CAP * H * (P + 1), H * (P + 1), P + 1, 1))),
])
def test_rows_not_in_whole_vectors_are_staged_element_by_element(name, array):
    """Unaligned bases and odd strides are legal inputs: the kernel copies their rows element by element."""
    assert bind(mode="compact", **{name: array}).params["vector_rows"] == 0


def test_D_per_head_broadcasts_over_headdim():
    plan = PLANS["verify"]
    args = verify_args(D=fake_array(0x70000000, (H,), "fp32"))
    call = plan.bind(**{k: as_device_array(v, k) if k in plan.arrays else v for k, v in args.items()})
    assert call.params["stride_D_dim"] == 0 and call.params["stride_D_head"] == 1


BAD = [
    ({"mode": "decode"}, errors.InvalidArgumentError, "mode", "expected one of"),
    ({"x": fake_array(0x70000000, (BATCH, T, H, P), "fp32")}, errors.DTypeError, "dt", "expected dtype fp32"),
    ({"state": fake_array(0x70000000, (SLOTS, H, P, N), "int32")}, errors.DTypeError, "state", "fp32 or bf16"),
    ({"state": fake_array(0x70000000, (SLOTS, H, P, N), "fp32", strides=(H * P * N, P * N, 1, P))},
     errors.StrideError, "state", "contiguous headdim"),
    ({"state": fake_array(0x70000004, (SLOTS, H, P, N), "fp32")}, errors.AlignmentError, "state", "16-byte aligned"),
    ({"state": fake_array(0x70000000, (SLOTS, H, P, N), "fp32", strides=(H * P * N + 2, P * N, N, 1))},
     errors.StrideError, "state", "multiples of"),
    ({"B": fake_array(0x70000000, (BATCH, T, 3, N))}, errors.ShapeError, "B", "must divide nheads"),
    ({"x": fake_array(0x70000000, (BATCH, T, H, P), "fp16", strides=(T * H * P, H * P, P, 2))},
     errors.StrideError, "x", "last dim must be contiguous"),
    ({"A": fake_array(0x70000000, (H + 1,), "fp32")}, errors.ShapeError, "A", "(nheads,)"),
    ({"state_indices": fake_array(0x70000000, (BATCH,), "int64")}, errors.DTypeError, "state_indices", "int32"),
    ({"snapshot_indices": fake_array(0x70000000, (BATCH, T), "int32")}, errors.InvalidArgumentError,
     "snapshot_indices", "snapshot_indices: not used in update mode"),
    ({"mode": "snapshot", "num_accepted": fake_array(0x70000000, (BATCH,), "int32")}, errors.InvalidArgumentError,
     "num_accepted", "num_accepted: not used in snapshot mode (it takes snapshot_indices)"),
    ({"dt_limit": (1.0, 0.5)}, errors.InvalidArgumentError, "dt_limit", "greater than"),
    ({"out": None}, errors.ArrayProtocolError, "out", "required, got None"),
    ({"rejected": fake_array(0x70000000, (2,), "int32")}, errors.ShapeError, "rejected",
     "expected shape (1,) (one int32 counter), got (2,)"),
] + [({"state": fake_array(0x70000000, (SLOTS, H, P, n), "fp32"), "B": fake_array(0x71000000, (BATCH, T, G, n), "fp16"),
       "C": fake_array(0x72000000, (BATCH, T, G, n), "fp16")}, errors.ShapeError, "state",
      f"d_state (dim 3) = {n} must be a positive multiple of 32")
     for n in (16, 0)  # (a warp's lanes split d_state: 16 divided by zero, 0 was reported as a stride)
] + [({"dt_softplus": flag}, errors.InvalidArgumentError, "dt_softplus", "expected a bool (or 0 / 1)")
     for flag in (1.0, "yes", None, 2)]  # the rule ssd_chunk_cumsum applies too (validation.expect_bool)


@pytest.mark.parametrize("change,error,argument,fragment", BAD)
def test_refused_calls_name_the_argument_and_never_reach_the_driver(no_driver, change, error, argument, fragment):  # noqa: F811
    expect_refused("verify", verify_args(**change), error, argument, fragment)


def test_unknown_or_missing_keyword_names_it(no_driver):  # noqa: F811
    args = verify_args()
    del args["mode"]
    with pytest.raises(errors.InvalidArgumentError, match="^mode: required by verify; verify accepts: mode, ") as info:
        runtime.launch("verify", stream=0, **args)
    assert info.value.argument == "mode"
    with pytest.raises(errors.InvalidArgumentError, match="^snapshot_idx: not an argument of verify "
                       r"\(did you mean 'snapshot_indices'\?\)") as info:
        runtime.launch("verify", stream=0, snapshot_idx=None, **verify_args())
    assert info.value.argument == "snapshot_idx"


def test_compact_needs_its_window_and_fits_the_capacity(no_driver):  # noqa: F811
    args = verify_args("compact")
    del args["window_B"]
    with pytest.raises(errors.InvalidArgumentError, match="window_B: required in compact mode"):
        runtime.launch("verify", stream=0, **args)
    big = verify_args("compact", x=fake_array(0x70000000, (BATCH, CAP + 1, H, P), "fp16"))
    with pytest.raises(errors.ShapeError):
        runtime.launch("verify", stream=0, **big)


def test_plans_name_the_kernels_parameters_in_order():
    """The launch plans pack by name from the manifest; the names must be the kernels' own (build side)."""
    pytest.importorskip("cutlass", reason="needs the CuTe DSL (requirements/build.txt)")
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT))
    from kernel_src.families import kernel_class
    kernels = {"verify": kernel_class("verify")("compact", 64, 128, "bf16", "fp32", "bf16"),
               "ssd_chunk_cumsum": kernel_class("ssd_chunk_cumsum")(64, "bf16"),
               "ssd_fwd": kernel_class("ssd_fwd")(64, 128, "bf16", "fp32"),
               "ssd_fwd_paired": kernel_class("ssd_fwd_paired")(64, 128, "bf16", "fp32"),
               "ssd_fwd_inline": kernel_class("ssd_fwd_inline")(64, 128, "bf16", "fp32"),
               "ssd_fwd_pass": kernel_class("ssd_fwd_pass")(64, 128, "bf16", "fp32"),
               "ssd_fwd_states": kernel_class("ssd_fwd_states")(64, 128, "bf16", "fp32"),
               "conv1d_verify": kernel_class("conv1d_verify")("compact", "bf16", "fp32"),
               "conv1d_fwd": kernel_class("conv1d_fwd")("bf16", "fp32"),
               "ssd_bwd_dstates": kernel_class("ssd_bwd_dstates")(64, 128, "bf16"),
               "ssd_bwd_walks": kernel_class("ssd_bwd_walks")(64, 128, "bf16", "fp32"),
               "ssd_bwd_chunk": kernel_class("ssd_bwd_chunk")(64, 128, "bf16", "fp32"),
               "ssd_bwd_reduce": kernel_class("ssd_bwd_reduce")(64, "bf16")}
    composites = {family for family, plan in PLANS.items() if isinstance(plan, CompositePlan)}
    # ssd_fwd is both: a family of one kernel whose call may be split into two launches of it
    assert composites == {"ssd_bwd", "ssd_fwd"} and set(kernels) == set(PLANS) - {"ssd_bwd"}
    for family, kernel in kernels.items():
        assert tuple(p.name for p in kernel.params()) == PLANS[family].param_names, family
        if family.startswith("ssd_bwd_") or family in ("ssd_fwd_states", "ssd_fwd_paired", "ssd_fwd_inline",
                                                       "ssd_fwd_pass"):
            continue  # a composite's step: its plan binds no caller arrays (ssd_bwd's, ssd_fwd's plan does)
        # every pointer the kernel takes is an array argument the dispatcher adapts before the plan sees it (the
        # workspace reaches the kernel through others: ssd_fwd's chunk_states and segment_flags)
        from_workspace = {"segment_flags"} if family == "ssd_fwd" else set()
        pointers = {p.name for p in kernel.params() if p.kind == "ptr"}
        assert pointers - from_workspace == set(PLANS[family].arrays) - {"workspace"}, family


MODES = ("update", "snapshot", "compact")
VERIFY_WRITTEN = ("out", "state", "rejected", "window_count", "window_x", "window_B", "window_dt")  # (by any mode)
# (the pool's rows move 16 bytes at a time, in headdim × d_state blocks; the kernels take any stride along the last
# dim of the per-head vectors, dt, the indices and the window's dt and counts)
VERIFY_EXEMPT = dict(vectors=("state",), blocks=("state",),
                     free_last_stride=("A", "D", "dt", "dt_bias", "state_indices", "snapshot_indices", "num_accepted",
                                       "window_count", "window_dt"))


def verify_options_args(mode: str, D_shape=(H, P)) -> dict:
    return verify_args(mode, D=fake_array(0x5000_0000, D_shape, "fp32"))


@pytest.mark.parametrize("target", corruption_targets([verify_options_args(mode) for mode in MODES], VERIFY_WRITTEN,
                                                      **VERIFY_EXEMPT), ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid call (mode and options drawn) with one array made wrong (each argument, each way): a typed refusal
    naming one of the call's arguments (the one made wrong, where nothing else can be), and the driver never
    opened."""
    mode = data.draw(st.sampled_from([m for m in MODES if target[0] in verify_args(m)]), label="mode")
    args = verify_options_args(mode, data.draw(st.sampled_from([(H,), (H, P)]), label="D"))
    for name in ("D", "z", "dt_bias", "rejected"):
        if target[0] != name and data.draw(st.booleans(), label=f"drop {name}"):
            del args[name]
    expect_valid_call("verify", args)
    # (a pool may be fp32, bf16 or fp16; without window records, it may have any number of slots)
    aliased = corrupt_one_argument(data, args, VERIFY_WRITTEN, target, dtypes={"state": {"<f2"}},
                                   free_dims={"state": {0}} if mode != "compact" else {}, **VERIFY_EXEMPT)
    expect_corrupted_call_refused("verify", args, target, aliased)
