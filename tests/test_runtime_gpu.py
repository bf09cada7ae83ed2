"""GPU tests of the runtime with the real cubins (marked ``gpu``; skipped without a CUDA device).

Runtime and cubins come from where tests/conftest.py says (the source tree and ``build/stage``, or the
installed wheels with ``MAMBA2_AOT_TEST_INSTALLED=1``).

    python -m pytest -m gpu tests/test_runtime_gpu.py -q
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")

import mamba2_aot  # noqa: E402
import reference  # noqa: E402  (the fp64 oracle, tests/reference)
from runtime_fakes import OnlyDLPack  # noqa: E402
from mamba2_aot import (AliasingError, InvalidArgumentError, ShapeError, driver,  # noqa: E402
                        manifest, runtime)

pytestmark = pytest.mark.gpu


def built_variants(device=0):
    """``[(chunk_size, dt_dtype)]`` built for the device's arch (fails clearly if none are installed)."""
    cc = torch.cuda.get_device_capability(device)
    table = manifest.catalog().index(cc)
    return sorted((v.constants["chunk_size"], v.constants["dt_dtype"]) for (fam, _), v in table.items()
                  if fam == "ssd_chunk_cumsum")


TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def assert_close(got, want, tol, what):
    assert not torch.isnan(got).any() and not torch.isinf(got).any(), f"{what}: NaN/Inf in output"
    scale = want.pow(2).mean().sqrt().clamp_min(1e-30)
    err = (got.double() - want).abs().max() / scale
    assert err <= tol, f"{what}: max abs error / ref RMS = {err:.3g} > {tol}"


def make_case(B=2, L=300, H=8, Q=64, dtype="bf16", bias=True, strided=True, device="cuda"):
    """Inputs (dt a strided slice of a wider buffer when ``strided``) and NaN-poisoned outputs."""
    gen = torch.Generator(device="cpu").manual_seed(B * 1000 + L + H + Q)
    wide = torch.randn(B, L, 3 * H, generator=gen).mul(2.0).to(TORCH_DTYPES[dtype]).to(device)
    dt = wide[:, :, H:2 * H] if strided else wide[:, :, :H].contiguous()
    A = -torch.rand(H, generator=gen).add(0.5).to(device)
    dt_bias = torch.randn(H, generator=gen).mul(0.5).to(device) if bias else None
    nchunks = math.ceil(L / Q)
    dt_out = torch.full((B, H, nchunks, Q), math.nan, device=device)
    # dA_cumsum as a permuted view: exercises arbitrary output strides
    dA_cumsum = torch.full((B, nchunks, Q, H), math.nan, device=device).permute(0, 3, 1, 2)
    return {"dt": dt, "A": A, "dt_bias": dt_bias, "dt_out": dt_out, "dA_cumsum": dA_cumsum, "chunk_size": Q}


def check_case(case, softplus=False, dt_limit=(0.0, math.inf)):
    bias = case["dt_bias"].cpu() if case["dt_bias"] is not None else None
    want_dt, want_cs = reference.chunk_cumsum_reference(case["dt"].cpu(), case["A"].cpu(), chunk_size=case["chunk_size"],
                                                        dt_bias=bias, dt_softplus=softplus, dt_limit=dt_limit)
    assert_close(case["dt_out"].cpu(), want_dt, 1e-5, "dt_out")
    assert_close(case["dA_cumsum"].cpu(), want_cs, 1e-4, "dA_cumsum")


# -- correctness across variants, frameworks and protocols ---------------------------------------------


@pytest.mark.parametrize("softplus,dt_limit,bias", [(False, (0.0, math.inf), False), (True, (0.0, math.inf), True),
                                                    (True, (0.05, 2.0), True)])
def test_torch_all_built_variants(softplus, dt_limit, bias):
    variants = built_variants()
    assert variants, "no ssd_chunk_cumsum cubins for this GPU"
    for Q, dtype in variants:
        for L in (1, Q - 1, 3 * Q + 5):
            case = make_case(L=L, Q=Q, dtype=dtype, bias=bias)
            runtime.launch("ssd_chunk_cumsum", dt_softplus=softplus, dt_limit=dt_limit, **case)
            torch.cuda.synchronize()
            check_case(case, softplus, dt_limit)


@pytest.mark.parametrize("H", [1, 16, 20, 33])
def test_head_tiles(H):
    """Each CTA takes 16 heads: one head, a whole tile, a last tile of 4 heads and one of a single head. dt contiguous
    (heads innermost, the layout the kernel's tile loads are shaped for) and strided; L ending inside a chunk."""
    for Q, dtype in built_variants():
        for strided in (False, True):
            case = make_case(B=3, L=2 * Q + 7, H=H, Q=Q, dtype=dtype, strided=strided)
            runtime.launch("ssd_chunk_cumsum", dt_softplus=True, **case)
            torch.cuda.synchronize()
            check_case(case, softplus=True)


def test_plain_dlpack_capsule():
    Q, dtype = built_variants()[0]
    case = make_case(Q=Q, dtype=dtype)
    wrapped = {k: OnlyDLPack(v) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    runtime.launch("ssd_chunk_cumsum", dt_softplus=True, stream=torch.cuda.current_stream().cuda_stream, **wrapped)
    torch.cuda.synchronize()
    check_case(case, softplus=True)


def test_cupy_cuda_array_interface():
    cupy = pytest.importorskip("cupy")
    fp32 = [Q for Q, d in built_variants() if d == "fp32"]
    if not fp32:
        pytest.skip("no fp32 variant built (CAI cannot express bf16)")
    case = make_case(Q=fp32[0], dtype="fp32")
    arrays = {k: cupy.asarray(v) if isinstance(v, torch.Tensor) else v for k, v in case.items()}  # zero-copy CAI
    torch.cuda.synchronize()
    runtime.launch("ssd_chunk_cumsum", stream=cupy.cuda.get_current_stream(), **arrays)
    cupy.cuda.get_current_stream().synchronize()
    check_case(case)


# -- streams, threads, graphs -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["explicit", "current"])
def test_non_default_stream_is_ordered(how):
    Q, dtype = built_variants()[0]
    case = make_case(Q=Q, dtype=dtype, bias=False)
    new_dt = torch.randn_like(case["dt"], dtype=torch.float32).to(case["dt"].dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep `side` busy so a launch on any other stream would race ahead
        case["dt"].copy_(new_dt)
        if how == "explicit":
            runtime.launch("ssd_chunk_cumsum", stream=side, **case)
        else:
            runtime.launch("ssd_chunk_cumsum", **case)  # stream=None: torch's current stream, i.e. `side`
    side.synchronize()
    check_case(case)  # computed from new_dt: the kernel ran after the copy on `side`


def test_fresh_thread_without_context():
    Q, dtype = built_variants()[0]
    case = make_case(Q=Q, dtype=dtype)
    torch.cuda.synchronize()
    errors = []

    def worker():
        try:
            runtime.launch("ssd_chunk_cumsum", stream=0, **case)
            torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors
    check_case(case)


def test_cuda_graph_after_preload():
    Q, dtype = built_variants()[0]
    runtime.preload(["ssd_chunk_cumsum"])
    case = make_case(Q=Q, dtype=dtype)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runtime.launch("ssd_chunk_cumsum", dt_softplus=True, **case)
    case["dt"].copy_(torch.randn_like(case["dt"], dtype=torch.float32))
    case["dt_out"].fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    check_case(case, softplus=True)


# A child process imports the runtime (and the cubin wheels) from where this one does: the source tree, or
# the installed wheels when MAMBA2_AOT_TEST_INSTALLED=1.
_CHILD_PYTHONPATH = os.pathsep.join(p for p in sys.path if p)


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=_CHILD_PYTHONPATH)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_cold_kernel_during_capture_is_refused():
    result = _run_python("""
        import torch, mamba2_aot
        from mamba2_aot import runtime, GraphCaptureError
        from test_runtime_gpu import built_variants, make_case
        Q, dtype = built_variants()[0]
        case = make_case(Q=Q, dtype=dtype)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                runtime.launch("ssd_chunk_cumsum", **case)
        except GraphCaptureError as exc:
            assert "preload()" in str(exc), exc
            print("REFUSED")
    """)
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout


def test_doctor_on_gpu():
    result = subprocess.run([sys.executable, "-m", "mamba2_aot", "doctor"], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=_CHILD_PYTHONPATH), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": loads" in result.stdout and "FAILS" not in result.stdout


# -- refusals write nothing -------------------------------------------------------------------------------


@pytest.mark.parametrize("change,error", [
    (lambda c: c.update(dt_limit=(1.0, 0.0)), InvalidArgumentError),
    (lambda c: c.update(A=c["A"][:-1]), ShapeError),
    (lambda c: c.update(dA_cumsum=c["dt_out"]), AliasingError),
])
def test_refused_call_writes_nothing(change, error):
    Q, dtype = built_variants()[0]
    case = make_case(Q=Q, dtype=dtype)
    change(case)
    with pytest.raises(error):
        runtime.launch("ssd_chunk_cumsum", **case)
    torch.cuda.synchronize()
    assert torch.isnan(case["dt_out"]).all() and torch.isnan(case["dA_cumsum"]).all()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_while_first_is_current():
    Q, dtype = built_variants(1)[0]
    case = make_case(Q=Q, dtype=dtype, device="cuda:1")
    with torch.cuda.device(0):
        runtime.launch("ssd_chunk_cumsum", **case)
    torch.cuda.synchronize(1)
    check_case(case)
    assert driver.get().current_context() in (0, driver.get().primary_context(0))


def test_version_is_locked_to_the_cubins():
    for m in manifest.catalog().manifests:
        assert m.version == mamba2_aot.__version__
