"""CPU tests of validation, variant selection, loading and launching, against a fake driver."""
from __future__ import annotations

import ctypes
import functools
import math
import os
import re
import struct
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mamba2_aot import (AlignmentError, AliasingError, ArchMismatchError, CubinNotInstalledError, CudaDriverError,
                        DeviceError, DTypeError, GraphCaptureError, InvalidArgumentError, ManifestError, ShapeError,
                        StrideError, UnvalidatedVariantError, VariantNotFoundError, driver, manifest, runtime,
                        validation)
from mamba2_aot.dispatch import ParamPacker
from mamba2_aot.plans import PLANS
from mamba2_aot.plans.ssd_chunk_cumsum import ChunkCumsumPlan
from mamba2_aot.tensors import as_device_array
from runtime_fakes import (CUMSUM_KINDS, FakeCAI, FakeDriver, FakeDLPack, c_layout, corrupt_one_argument,  # noqa: F401
                           corruption_targets, expect_corrupted_call_refused, expect_valid_call, fake_array,
                           fake_runtime, mark_unvalidated, no_driver, unpack_params, write_cubin_dir)

MB = 1 << 20
LAYOUT = c_layout(ChunkCumsumPlan.param_names, CUMSUM_KINDS)


def cumsum_args(B=2, L=300, H=4, Q=64, *, dt_dtype="fp32", bias=True, base=0x10000000):
    """Valid fake arguments for ssd_chunk_cumsum, each array in its own megabyte."""
    nchunks = -(-L // Q)
    args = {
        "dt": fake_array(base, (B, L, H), dt_dtype),
        "A": fake_array(base + MB, (H,)),
        "dt_out": fake_array(base + 2 * MB, (B, H, nchunks, Q)),
        "dA_cumsum": fake_array(base + 3 * MB, (B, H, nchunks, Q)),
        "chunk_size": Q,
    }
    if bias:
        args["dt_bias"] = fake_array(base + 4 * MB, (H,))
    return args


# (a token more or less along L may leave the number of chunks as it is; the kernel takes any stride along every dim)
CUMSUM_EXEMPT = dict(free_dims={"dt": {1}}, free_last_stride=("dt", "A", "dt_bias", "dt_out", "dA_cumsum"))


@pytest.mark.parametrize("target", corruption_targets([cumsum_args(bias=True)], ("dt_out", "dA_cumsum"),
                                                      **CUMSUM_EXEMPT), ids="-".join)
@given(data=st.data())
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_one_corrupted_cumsum_argument_is_refused_before_anything_launches(no_driver, data, target):
    """A valid ssd_chunk_cumsum call (dt dtype, bias and chunk size drawn) with one array made wrong (each argument,
    each way): a typed refusal naming one of its arguments (the one made wrong, where nothing else can be); the
    driver never opened."""
    args = cumsum_args(Q=data.draw(st.sampled_from([64, 128, 256]), label="chunk_size"),
                       dt_dtype=data.draw(st.sampled_from(["fp16", "fp32"]), label="dt dtype"),
                       bias=target[0] == "dt_bias" or data.draw(st.booleans(), label="dt_bias"))
    expect_valid_call("ssd_chunk_cumsum", args)
    # (dt may be bf16, fp16 or fp32)
    aliased = corrupt_one_argument(data, args, ("dt_out", "dA_cumsum"), target, dtypes={"dt": {"<f2", "<f4"}},
                                   **CUMSUM_EXEMPT)
    expect_corrupted_call_refused("ssd_chunk_cumsum", args, target, aliased)


def test_plan_contract():
    plan = PLANS["ssd_chunk_cumsum"]
    assert plan.param_names == (
        "dt", "A", "dt_bias", "dt_out", "dA_cumsum", "batch", "seqlen", "nheads", "nchunks",
        "stride_dt_batch", "stride_dt_seqlen", "stride_dt_head", "stride_A_head", "stride_dt_bias_head",
        "stride_dt_out_batch", "stride_dt_out_head", "stride_dt_out_chunk", "stride_dt_out_pos",
        "stride_dA_cumsum_batch", "stride_dA_cumsum_head", "stride_dA_cumsum_chunk", "stride_dA_cumsum_pos",
        "has_dt_bias", "dt_softplus", "dt_min", "dt_max")
    args = {k: as_device_array(v, k) if k in plan.arrays else v for k, v in cumsum_args().items()}
    call = plan.bind(**args)
    assert set(call.params) == set(plan.param_names)
    assert call.grid == (5, 2, 1) and call.constants == {"chunk_size": 64, "dt_dtype": "fp32"}
    assert runtime.workspace_size("ssd_chunk_cumsum") == 0
    # one CTA per 16 heads (the grid rule chunks,batch,heads/16): 16 heads take one, 17 and 33 take two and three
    for heads, ctas in ((16, 1), (17, 2), (33, 3)):
        args = {k: as_device_array(v, k) if k in plan.arrays else v for k, v in cumsum_args(H=heads).items()}
        assert plan.bind(**args).grid == (5, 2, ctas)


# -- param packing ----------------------------------------------------------------------------------------


def test_param_packer_bytes():
    params = tuple(manifest.Param(**row) for row in c_layout(["p", "n", "s", "f", "g"],
                                                             ["ptr", "i32", "i64", "f32", "i32"]))
    packer = ParamPacker(params)
    pointers = packer.load(packer.pack({"p": 0xDEADBEEF00, "n": -3, "s": -(1 << 40), "f": math.inf, "g": 7}))
    raw = ctypes.string_at(pointers[0], packer.size)
    assert len(raw) == 32  # p@0 n@8 (pad) s@16 f@24 g@28
    assert struct.unpack_from("<Q", raw, 0)[0] == 0xDEADBEEF00
    assert struct.unpack_from("<i", raw, 8)[0] == -3
    assert struct.unpack_from("<q", raw, 16)[0] == -(1 << 40)
    assert struct.unpack_from("<f", raw, 24)[0] == math.inf
    assert struct.unpack_from("<i", raw, 28)[0] == 7
    assert [p - pointers[0] for p in pointers] == [0, 8, 16, 24, 28]
    assert packer.load(packer.pack({"p": 1, "n": 2, "s": 3, "f": 4.0, "g": 5}))[0] == pointers[0]  # reused per thread


@given(st.lists(st.sampled_from(["ptr", "i32", "i64", "f32"]), min_size=1, max_size=30), st.data())
def test_param_packer_property(kinds, data):
    layout = c_layout([f"p{i}" for i in range(len(kinds))], kinds)
    ranges = {"ptr": st.integers(0, 2**64 - 1), "i32": st.integers(-2**31, 2**31 - 1),
              "i64": st.integers(-2**63, 2**63 - 1), "f32": st.sampled_from([0.0, 1.5, -2.25, math.inf])}
    values = {row["name"]: data.draw(ranges[row["kind"]]) for row in layout}
    packer = ParamPacker(tuple(manifest.Param(**r) for r in layout))  # owns the buffer the pointers point into
    pointers = packer.load(packer.pack(values))
    codes = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}
    for row, address in zip(layout, pointers):
        assert struct.unpack(codes[row["kind"]], ctypes.string_at(address, row["size"]))[0] == values[row["name"]]


def test_launch_attribute_structs():
    assert driver.launch_attributes((1, 1, 1)) == (None, 0)
    attrs, n = driver.launch_attributes((2, 1, 1))
    assert n == 1 and attrs[0].id == driver.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert list(attrs[0].value.clusterDim) == [2, 1, 1]
    raw = bytes(attrs)
    assert len(raw) == 72 and struct.unpack_from("<i4xIII", raw) == (4, 2, 1, 1)
    config = driver.CUlaunchConfig(1, 2, 3, 4, 5, 6, 7, 0x99, attrs, 1)
    assert ctypes.addressof(config.attrs.contents) == ctypes.addressof(attrs)
    assert struct.unpack_from("<7I4xQ", bytes(config)) == (1, 2, 3, 4, 5, 6, 7, 0x99)


# -- validation: every refusal names the argument and never opens the driver ------------------------------


BAD_CALLS = [
    # (change to the valid arguments, error type, argument named, message fragment)
    (lambda a: a.update(dt=fake_array(0x10000000, (2, 300, 4), "int32")), DTypeError, "dt", "bf16 or fp16 or fp32"),
    (lambda a: a.update(dt=fake_array(0x10000000, (2, 300))), ShapeError, "dt", "3 dims (batch, seqlen, nheads)"),
    (lambda a: a.update(dt=fake_array(0x10000000, (2, 0, 4))), ShapeError, "dt", "seqlen (dim 1) must be >= 1"),
    (lambda a: a.update(dt=fake_array(0x10000000, (70000, 1, 4))), ShapeError, "dt", "batch (dim 0) = 70000"),
    (lambda a: a.update(A=fake_array(0x10100000, (5,))), ShapeError, "A", "expected shape (4,)"),
    (lambda a: a.update(A=fake_array(0x10100000, (4,), "fp16")), DTypeError, "A", "expected dtype fp32"),
    (lambda a: a.update(dt_bias=fake_array(0x10400000, (1, 4))), ShapeError, "dt_bias", "expected 1 dims"),
    (lambda a: a.update(dt_out=fake_array(0x10200000, (2, 4, 4, 64))), ShapeError, "dt_out", "(2, 4, 5, 64)"),
    (lambda a: a.update(dA_cumsum=fake_array(0x10300000, (2, 4, 5, 64), "fp16")), DTypeError, "dA_cumsum", "fp32"),
    (lambda a: a.update(dt_out=torch.zeros(2, 4, 5, 64)), DeviceError, "dt_out", "got a tensor on cpu"),
    (lambda a: a.update(A=[1.0] * 4), InvalidArgumentError, "A", "expected a CUDA array"),
    (lambda a: a.update(chunk_size=0), InvalidArgumentError, "chunk_size", "in [1,"),
    (lambda a: a.update(chunk_size="64"), InvalidArgumentError, "chunk_size", "expected an int"),
    (lambda a: a.update(dt_limit=(1.0, 0.5)), InvalidArgumentError, "dt_limit", "greater than hi"),
    (lambda a: a.update(dt_limit=(0.0, math.nan)), InvalidArgumentError, "dt_limit", "NaN"),
    (lambda a: a.update(dt_limit=(0.0,)), InvalidArgumentError, "dt_limit", "a pair"),
    (lambda a: a.update(dt_softplus="yes"), InvalidArgumentError, "dt_softplus", "a bool"),
    (lambda a: a.update(A=fake_array(0x10100002, (4,))), AlignmentError, "A", "not aligned"),
    (lambda a: a.update(dt_out=fake_array(0x10200000, (2, 4, 5, 64), strides=(0, 320, 64, 1))), StrideError,
     "dt_out", "overlap"),
    (lambda a: a.update(dt_out=FakeCAI(0x10200000, (2, 4, 5, 64), readonly=True)), InvalidArgumentError, "dt_out",
     "read-only"),
    # dA_cumsum inside dt's memory, and the two outputs sharing one buffer
    (lambda a: a.update(dA_cumsum=fake_array(0x10000000, (2, 4, 5, 64))), AliasingError, "dA_cumsum", "overlaps dt"),
    (lambda a: a.update(dA_cumsum=fake_array(0x10200000 + 256, (2, 4, 5, 64))), AliasingError, "dA_cumsum",
     "overlaps dt_out"),
    (lambda a: a.update(dt_out=fake_array(0x10400000, (2, 4, 5, 64))), AliasingError, "dt_out", "overlaps dt_bias"),
]


@pytest.mark.parametrize("change,error,argument,fragment", BAD_CALLS)
def test_refused_calls_name_the_argument_and_never_reach_the_driver(no_driver, change, error, argument, fragment):
    args = cumsum_args()
    change(args)
    with pytest.raises(error, match=re.escape(fragment)) as info:
        runtime.launch("ssd_chunk_cumsum", **args)
    assert info.value.argument == argument
    assert str(info.value).startswith(argument) or f" {argument}" in str(info.value)
    assert driver._driver is None


@pytest.mark.parametrize("flag", [1.0, "yes", None, 2, -1])
def test_dt_softplus_must_be_a_bool(no_driver, flag):  # verify's plan shares the rule: test_verify_plan.py
    with pytest.raises(InvalidArgumentError, match=r"^dt_softplus: expected a bool \(or 0 / 1\)") as info:
        runtime.launch("ssd_chunk_cumsum", dt_softplus=flag, **cumsum_args())
    assert info.value.argument == "dt_softplus" and driver._driver is None


@pytest.mark.parametrize("flag,expected", [(True, True), (False, False), (1, True), (0, False)])
def test_expect_bool_accepts_bools_and_0_1(flag, expected):
    np = pytest.importorskip("numpy")
    assert validation.expect_bool("f", flag) is expected
    assert validation.expect_bool("f", np.int64(flag)) is expected
    assert validation.expect_bool("f", np.bool_(flag)) is expected
    assert validation.expect_bool("f", np.array(bool(flag))) is expected
    assert validation.expect_bool("f", torch.tensor(bool(flag))) is expected


def test_misspelt_keyword_names_it_and_lists_the_accepted_ones(no_driver):
    args = cumsum_args()
    args["dtbias"] = args.pop("dt_bias")
    with pytest.raises(InvalidArgumentError) as info:
        runtime.launch("ssd_chunk_cumsum", **args)
    text = str(info.value)
    assert info.value.argument == "dtbias" and not isinstance(info.value, TypeError)
    assert text.startswith("dtbias: not an argument of ssd_chunk_cumsum (did you mean 'dt_bias'?)")
    assert "accepts: dt, A, dt_out, dA_cumsum, chunk_size, dt_bias, dt_softplus, dt_limit, stream" in text
    assert driver._driver is None


def test_several_unknown_keywords(no_driver):
    with pytest.raises(InvalidArgumentError, match="^foo, bar: not an argument of ssd_chunk_cumsum; ") as info:
        runtime.launch("ssd_chunk_cumsum", foo=1, bar=2, **cumsum_args())
    assert info.value.argument is None


def test_missing_keyword_names_it(no_driver):
    args = cumsum_args()
    del args["dA_cumsum"]
    with pytest.raises(InvalidArgumentError, match="^dA_cumsum: required by ssd_chunk_cumsum; ssd_chunk_cumsum "
                       "accepts: dt, A, dt_out, dA_cumsum, ") as info:
        runtime.launch("ssd_chunk_cumsum", **args)
    assert info.value.argument == "dA_cumsum" and driver._driver is None


def test_other_type_errors_from_bind_pass_through(no_driver, monkeypatch):
    class BuggyPlan(ChunkCumsumPlan):
        @functools.wraps(ChunkCumsumPlan.bind)
        def bind(self, **kwargs):
            raise TypeError("a plan bug")

    monkeypatch.setitem(PLANS, "ssd_chunk_cumsum", BuggyPlan())
    with pytest.raises(TypeError, match="^a plan bug$"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())


def test_constants_built_for_no_arch_refused_before_the_driver(no_driver, tmp_path, monkeypatch):
    write_cubin_dir(tmp_path, cc=(9, 0))
    write_cubin_dir(tmp_path, cc=(10, 0), chunk_sizes=(128,))
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))
    with pytest.raises(VariantNotFoundError) as info:
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=100))
    assert str(info.value) == (
        "ssd_chunk_cumsum: no built variant for chunk_size=100, dt_dtype=fp32 in the installed cubins (archs: "
        "sm_100a, sm_90a). Built ssd_chunk_cumsum variants: [chunk_size=64, dt_dtype=bf16] (sm_90a); "
        "[chunk_size=64, dt_dtype=fp32] (sm_90a); [chunk_size=128, dt_dtype=bf16] (sm_100a); "
        "[chunk_size=128, dt_dtype=fp32] (sm_100a); [chunk_size=256, dt_dtype=bf16] (sm_90a); "
        "[chunk_size=256, dt_dtype=fp32] (sm_90a)")
    assert driver._driver is None


def test_unvalidated_variant_refused_before_the_driver(no_driver, tmp_path, monkeypatch):
    mark_unvalidated(write_cubin_dir(tmp_path), 64)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))
    with pytest.raises(UnvalidatedVariantError, match=r"^ssd_chunk_cumsum: the only built variant for chunk_size=64, "
                       r"dt_dtype=fp32 in the installed cubins is ssd_chunk_cumsum\[chunk_size=64,dt_dtype=fp32\] in "
                       r"mamba2_aot_cubins_sm90 \(sm_90a\), an unvalidated build \(built with the experiment\(s\) "
                       r"bwd_products_ahead\); .* set MAMBA2_AOT_ALLOW_UNVALIDATED=1 to use it$"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=64))
    assert driver._driver is None


def test_unknown_family_lists_the_families_launch_takes(no_driver):
    with pytest.raises(VariantNotFoundError) as info:
        runtime.launch("ssd_nope")
    assert str(info.value) == ("unknown kernel family 'ssd_nope'; known families: conv1d_fwd, conv1d_verify, ssd_bwd, "
                               "ssd_chunk_cumsum, ssd_fwd, verify")   # (not the steps, which it refuses)


@pytest.mark.parametrize("call", [runtime.preload, runtime.list_variants])
def test_unknown_family_lists_the_steps_where_they_are_taken(no_driver, call):
    with pytest.raises(VariantNotFoundError) as info:
        call("ssd_bwd_chnk")
    assert str(info.value) == ("unknown kernel family 'ssd_bwd_chnk'; known families and steps: conv1d_fwd, "
                               "conv1d_verify, ssd_bwd, ssd_bwd_chunk, ssd_bwd_dstates, ssd_bwd_reduce, ssd_bwd_walks, "
                               "ssd_chunk_cumsum, ssd_fwd, ssd_fwd_inline, ssd_fwd_paired, ssd_fwd_pass, "
                               "ssd_fwd_states, verify")
    assert driver._driver is None


def test_a_misspelt_keyword_is_named_before_an_array_off_the_gpu(no_driver):
    args = {**cumsum_args(), "A": torch.zeros(4)}   # a CPU tensor
    with pytest.raises(InvalidArgumentError, match="did you mean 'chunk_size'") as info:
        runtime.launch("ssd_chunk_cumsum", **args, chunk_sise=64)
    assert info.value.argument == "chunk_sise"
    with pytest.raises(DeviceError, match="CUDA") as info:   # the keywords right: the array's own error
        runtime.launch("ssd_chunk_cumsum", **args)
    assert info.value.argument == "A"


def test_empty_batch_is_a_no_op(no_driver):
    runtime.launch("ssd_chunk_cumsum", **cumsum_args(B=0))
    assert driver._driver is None


# -- launching through the fake driver --------------------------------------------------------------------


def test_launch_packs_params_and_config(fake_runtime):
    args = cumsum_args(B=2, L=300, H=4, Q=64)
    runtime.launch("ssd_chunk_cumsum", dt_softplus=True, dt_limit=(0.001, 10.0), stream=0x5000, **args)
    (record,) = fake_runtime.launches
    assert record["grid"] == (5, 2, 1) and record["block"] == (256, 1, 1) and record["smem"] == 32
    assert record["stream"] == 0x5000 and record["attrs"] == [] and record["context"] == 0x1000
    values = unpack_params(record, LAYOUT)
    assert values["dt"] == 0x10000000 and values["dt_bias"] == 0x10400000 and values["dA_cumsum"] == 0x10300000
    assert (values["batch"], values["seqlen"], values["nheads"], values["nchunks"]) == (2, 300, 4, 5)
    assert (values["stride_dt_batch"], values["stride_dt_seqlen"], values["stride_dt_head"]) == (1200, 4, 1)
    assert [values[f"stride_dt_out_{d}"] for d in ("batch", "head", "chunk", "pos")] == [1280, 320, 64, 1]
    assert (values["has_dt_bias"], values["dt_softplus"]) == (1, 1)
    assert values["dt_min"] == pytest.approx(0.001) and values["dt_max"] == 10.0
    loads = [c for c in fake_runtime.calls if c[0] == "load"]
    assert loads == [("load", b"fake cubin mamba2_aot_cubins_sm90 64 fp32")]


def test_launch_defaults_and_strided_views(fake_runtime):
    args = cumsum_args(bias=False)
    # dt as a strided slice of a wider buffer (e.g. from a fused projection), transposed outputs
    args["dt"] = fake_array(0x10000000, (2, 300, 4), strides=(300 * 40, 40, 3))
    args["dt_out"] = fake_array(0x10200000, (2, 4, 5, 64), strides=(1, 2, 512, 8))
    runtime.launch("ssd_chunk_cumsum", **args)
    values = unpack_params(fake_runtime.launches[0], LAYOUT)
    assert (values["dt_bias"], values["has_dt_bias"], values["stride_dt_bias_head"]) == (0, 0, 0)
    assert (values["dt_softplus"], values["dt_min"], values["dt_max"]) == (0, 0.0, math.inf)
    assert (values["stride_dt_batch"], values["stride_dt_seqlen"], values["stride_dt_head"]) == (12000, 40, 3)
    assert [values[f"stride_dt_out_{d}"] for d in ("batch", "head", "chunk", "pos")] == [1, 2, 512, 8]
    assert fake_runtime.launches[0]["stream"] == 0  # legacy default stream


def test_kernel_loaded_once_and_cached(fake_runtime):
    for _ in range(3):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    assert len(fake_runtime.launches) == 3
    assert sum(c[0] == "get_kernel" for c in fake_runtime.calls) == 1
    assert sum(c[0] == "is_capturing" for c in fake_runtime.calls) == 1


def test_identical_calls_reuse_validation(fake_runtime, monkeypatch):
    plan = PLANS["ssd_chunk_cumsum"]
    binds = []
    original = plan.bind
    monkeypatch.setattr(plan, "bind", lambda **kw: binds.append(1) or original(**kw))
    args = cumsum_args()
    runtime.launch("ssd_chunk_cumsum", **args)
    runtime.launch("ssd_chunk_cumsum", **args)
    assert len(binds) == 1 and len(fake_runtime.launches) == 2
    runtime.launch("ssd_chunk_cumsum", dt_softplus=True, **args)  # a different call validates again
    runtime.launch("ssd_chunk_cumsum", dt_limit=[0.0, 1.0], **args)  # unhashable option: no memo, still fine
    assert len(binds) == 3
    assert unpack_params(fake_runtime.launches[2], LAYOUT)["dt_softplus"] == 1


@pytest.mark.parametrize("option, equal_but_refused", [("dt_softplus", 1.0), ("chunk_size", 64.0)])
def test_a_remembered_call_does_not_admit_an_equal_value_of_another_type(fake_runtime, option, equal_but_refused):
    args = cumsum_args(Q=64)
    runtime.launch("ssd_chunk_cumsum", **{**args, option: {"dt_softplus": True, "chunk_size": 64}[option]})
    with pytest.raises(InvalidArgumentError) as info:   # (it was launched: the memo's key compared 1.0 == True)
        runtime.launch("ssd_chunk_cumsum", **{**args, option: equal_but_refused})
    assert info.value.argument == option and len(fake_runtime.launches) == 1


def test_concurrent_first_launches_load_once(fake_runtime):
    barrier = threading.Barrier(8)
    errors = []

    def worker():
        barrier.wait()
        try:
            runtime.launch("ssd_chunk_cumsum", **cumsum_args())
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(fake_runtime.launches) == 8
    assert sum(c[0] == "load" for c in fake_runtime.calls) == 1


def test_bad_chunk_size_lists_built_variants(fake_runtime):
    with pytest.raises(VariantNotFoundError) as info:
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=128))
    text = str(info.value)
    assert "chunk_size=128" in text and "[chunk_size=64, dt_dtype=bf16]" in text and "sm_90" in text
    assert not fake_runtime.launches


def test_unbuilt_dtype_lists_built_variants(fake_runtime):
    with pytest.raises(VariantNotFoundError, match="dt_dtype=fp16 in the installed cubins.*dt_dtype=fp32"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(dt_dtype="fp16"))
    assert not fake_runtime.calls  # refused before the device was looked at


def test_variant_built_only_for_another_arch(tmp_path, monkeypatch, fake_runtime):
    write_cubin_dir(tmp_path / "two", cc=(9, 0), chunk_sizes=(64,))
    write_cubin_dir(tmp_path / "two", cc=(10, 0), chunk_sizes=(128,))
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path / "two"))
    manifest.catalog(refresh=True)
    with pytest.raises(VariantNotFoundError, match=r"chunk_size=128, dt_dtype=fp32 on sm_90\. Built ssd_chunk_cumsum "
                       r"variants for sm_90: \[chunk_size=64, dt_dtype=bf16\]; \[chunk_size=64, dt_dtype=fp32\]$"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=128))
    assert not fake_runtime.launches


def test_unvalidated_variant_launches_only_when_allowed(fake_runtime, tmp_path, monkeypatch):
    mark_unvalidated(tmp_path / "mamba2_aot_cubins_sm90", 64)
    with pytest.raises(UnvalidatedVariantError):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=64))
    assert not fake_runtime.calls  # refused before the device was looked at
    assert [key for key, _ in runtime.preload()] == ["ssd_chunk_cumsum[chunk_size=256,dt_dtype=bf16]",
                                                      "ssd_chunk_cumsum[chunk_size=256,dt_dtype=fp32]"]
    monkeypatch.setenv(manifest.ENV_ALLOW_UNVALIDATED, "1")
    manifest.catalog(refresh=True)  # (read at discovery)
    runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=64))
    assert len(fake_runtime.launches) == 1
    assert [c for c in fake_runtime.calls if c[0] == "load"][-1] == ("load", b"fake cubin mamba2_aot_cubins_sm90 64 fp32")


def test_unvalidated_variant_for_the_device_arch_refused_at_its_lookup(fake_runtime, tmp_path):
    mark_unvalidated(tmp_path / "mamba2_aot_cubins_sm90", 64)
    write_cubin_dir(tmp_path, cc=(10, 0))  # validated for sm_100: the call may run somewhere, not on this sm_90
    with pytest.raises(UnvalidatedVariantError, match="dt_dtype=fp32 on sm_90 is ssd_chunk_cumsum"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args(Q=64))
    assert not [c for c in fake_runtime.calls if c[0] == "load"] and not fake_runtime.launches


def test_wrong_arch_names_the_wheel(fake_runtime):
    fake_runtime.capabilities = [(10, 0)]
    with pytest.raises(CubinNotInstalledError, match="pip install 'mamba2_aot_cubins_sm100==.*, or build them with "
                       "`scons arch=sm100` and point MAMBA2_AOT_CUBIN_DIR at"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    assert not [c for c in fake_runtime.calls if c[0] == "load"]  # checked before loading


def test_no_binary_for_gpu_becomes_arch_error(fake_runtime):
    fake_runtime.get_kernel_error = CudaDriverError(209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image")
    with pytest.raises(ArchMismatchError, match="install the cubins for sm_90"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())


def test_param_table_mismatch(fake_runtime):
    fake_runtime.param_table = [(0, 8)]
    with pytest.raises(ManifestError, match="parameter table"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    fake_runtime.param_table = [(r["offset"], r["size"]) for r in LAYOUT]
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())


def test_manifest_params_must_match_plan(tmp_path, monkeypatch, fake_runtime):
    pkg = write_cubin_dir(tmp_path / "other", cc=(9, 0))
    data = pkg / "manifest.json"
    data.write_text(data.read_text().replace('"stride_A_head"', '"stride_A"'))
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(pkg))
    manifest.catalog(refresh=True)
    with pytest.raises(ManifestError, match="do not match this runtime's plan"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())


def test_graph_capture_needs_preload(fake_runtime):
    fake_runtime.capturing = True
    with pytest.raises(GraphCaptureError, match=r"call mamba2_aot.preload\(\)"):
        runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    assert not [c for c in fake_runtime.calls if c[0] == "load"]
    loaded = runtime.preload()
    assert sorted(loaded) == sorted((f"ssd_chunk_cumsum[chunk_size={q},dt_dtype={d}]", 0)
                                    for q in (64, 256) for d in ("bf16", "fp32"))
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())  # still capturing: now fine
    assert len(fake_runtime.launches) == 1


def test_preload_selection(fake_runtime):
    assert runtime.preload("ssd_chunk_cumsum", devices=0)
    with pytest.raises(VariantNotFoundError):
        runtime.preload(["nope"])
    fake_runtime.capabilities = [(9, 0), (8, 0)]
    with pytest.raises(CubinNotInstalledError):
        runtime.preload(devices=[1])
    assert runtime.preload()  # device 1 without cubins is skipped by default


def test_device_mismatch(fake_runtime):
    args = cumsum_args()
    args["dA_cumsum"] = fake_array(fake_runtime.device_split + MB, (2, 4, 5, 64))  # resolves to cuda:1
    with pytest.raises(DeviceError, match="dA_cumsum is on cuda:1 but dt is on cuda:0") as info:
        runtime.launch("ssd_chunk_cumsum", **args)
    assert info.value.argument == "dA_cumsum"


def test_dlpack_device_mismatch_without_pointer_query(fake_runtime):
    args = cumsum_args()
    args["A"] = FakeDLPack(0x10100000, (4,), device=(2, 1))
    with pytest.raises(DeviceError, match="A is on cuda:1"):
        runtime.launch("ssd_chunk_cumsum", **args)


def test_stream_of_another_device(fake_runtime):
    fake_runtime.stream_contexts[0x5000] = 0x1001  # cuda:1's primary context
    with pytest.raises(DeviceError, match="^stream: ") as info:
        runtime.launch("ssd_chunk_cumsum", stream=0x5000, **cumsum_args())
    assert info.value.argument == "stream"


def test_context_bound_then_restored(fake_runtime):
    fake_runtime.current = 0x1001  # the thread has cuda:1's context current
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    assert fake_runtime.launches[0]["context"] == 0x1000
    assert fake_runtime.current == 0x1001
    # a fresh thread (no context) keeps the primary context bound
    fake_runtime.current = 0
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    assert fake_runtime.current == 0x1000


def test_context_bound_before_any_stream_query(fake_runtime):
    fake_runtime.current = 0  # a fresh thread: stream 0 only has a meaning once a context is current
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    names = [c[0] for c in fake_runtime.calls]
    assert names.index("bind") < names.index("is_capturing")
    assert ("function", 0x1000) in fake_runtime.calls  # CUfunction taken in the primary context


def test_cai_producer_stream_is_waited_on(fake_runtime):
    args = cumsum_args()
    cai = args["dt"].__cuda_array_interface__
    args["dt"] = FakeCAI(cai["data"][0], cai["shape"], cai["typestr"], cai["strides"], stream=0x9000)
    args["A"] = FakeCAI(0x10100000, (4,), stream=1)  # legacy default == our stream 0: no wait
    runtime.launch("ssd_chunk_cumsum", **args)
    assert [c for c in fake_runtime.calls if c[0] == "wait"] == [("wait", 0, 0x9000)]


def test_dlpack_arrays_get_the_launch_stream(fake_runtime):
    args = cumsum_args()
    dt = args["dt"] = FakeDLPack(0x10000000, (2, 300, 4))
    runtime.launch("ssd_chunk_cumsum", stream=0x5000, **args)
    assert dt.requests[0]["stream"] == 0x5000
    runtime.launch("ssd_chunk_cumsum", **args)
    assert dt.requests[1]["stream"] == 1  # DLPack's name for the legacy default stream


def test_large_smem_and_cluster_attributes(tmp_path, monkeypatch, fake_runtime):
    pkg = write_cubin_dir(tmp_path / "big", cc=(9, 0), dynamic_smem=100_000, cluster=(4, 3, 1))
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(pkg))
    manifest.catalog(refresh=True)
    runtime.launch("ssd_chunk_cumsum", **cumsum_args())
    attrs = [c for c in fake_runtime.calls if c[0] == "set_attribute"]
    assert attrs == [("set_attribute", driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100_000, 0),
                     ("set_attribute", driver.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, 0)]
    assert fake_runtime.launches[0]["attrs"] == [(4, 3, 1)] and fake_runtime.launches[0]["smem"] == 100_000


def test_list_variants(fake_runtime, tmp_path):
    rows = runtime.list_variants("ssd_chunk_cumsum")
    assert len(rows) == 4 and rows[0]["arch"] == "sm_90a" and rows[0]["compute_capability"] == (9, 0)
    assert (rows[0]["validated"], rows[0]["experiments"], rows[0]["usable"]) == (True, [], True)
    with pytest.raises(VariantNotFoundError, match="unknown kernel family 'ssd_chunk_cumsun'"):
        runtime.list_variants("ssd_chunk_cumsun")   # a misspelt family is named, not an empty list
    mark_unvalidated(tmp_path / "mamba2_aot_cubins_sm90", 64)
    manifest.catalog(refresh=True)
    rows = {row["key"]: row for row in runtime.list_variants("ssd_chunk_cumsum")}
    row = rows["ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]"]
    assert (row["validated"], row["experiments"], row["usable"]) == (False, ["bwd_products_ahead"], False)


def test_list_variants_reports_a_cubin_source_it_could_not_read(fake_runtime, tmp_path, monkeypatch):
    """A MAMBA2_AOT_CUBIN_DIR without a manifest: beside installed cubins a warning, alone the error (not [])."""
    monkeypatch.setattr(manifest, "_installed_manifest_paths", lambda: [])
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, f"{tmp_path}{os.pathsep}{tmp_path / 'nowhere'}")
    manifest.catalog(refresh=True)
    with pytest.warns(RuntimeWarning, match="nowhere not read: .*holds no manifest.json"):
        assert len(runtime.list_variants("ssd_chunk_cumsum")) == 4
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path / "nowhere"))
    manifest.catalog(refresh=True)
    depths = []
    for call in (runtime.list_variants, runtime.list_variants, lambda: manifest.catalog().for_capability((9, 0)),
                 lambda: manifest.catalog().for_capability((9, 0))):
        with pytest.raises(CubinNotInstalledError, match="nowhere holds no manifest.json") as info:
            call()
        depths.append(len(info.traceback))
    assert depths[0] == depths[1] and depths[2] == depths[3]   # (one stored error raised again: no growing traceback)


def test_fake_driver_matches_real_driver_interface():
    # Every method the fake offers exists on the real driver class with the same name.
    fake_methods = {n for n in vars(FakeDriver) if not n.startswith("_")} - {"device_split"}
    assert fake_methods <= set(dir(driver.CudaDriver))
