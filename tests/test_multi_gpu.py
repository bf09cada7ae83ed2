"""One process, two GPUs: kernels run on their tensors' device whatever the current device, from several
threads at once, are loaded once per device, and a stream of the other device is refused.

Marked ``gpu``; skipped with fewer than two CUDA devices.
"""
import threading

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs two CUDA devices")]

import reference  # noqa: E402
from mamba2_aot import DeviceError, dispatch, runtime  # noqa: E402
from test_verify_gpu import Case, _launch, _tolerances  # noqa: E402


def _verify_on(device: str, seed: int):
    """One T = 2 update on ``device``; returns (out, pool, the oracle's result) for checking."""
    case = Case(batch=2, T=2, H=8, G=2, seed=seed)
    case.kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    pool = case.pool.to(device, copy=True)  # the oracle starts from case.pool: the kernel must not update it
    out = case.out().to(device)
    idx = torch.tensor([3, 7], dtype=torch.int32, device=device)
    _launch("update", case, pool, out, idx)
    ref = reference.verify_update(case.pool.cpu(), idx.cpu(), pool_dtype=torch.float32, **case.oracle_args())
    return out, pool, ref


def _check(out, pool, ref):
    tol_out, tol_states = _tolerances("bf16", "fp32")
    torch.cuda.synchronize(out.device)
    reference.assert_close_scaled(out.cpu(), ref.out, tol_out, "out")
    reference.assert_close_scaled(pool[[3, 7]].cpu(), ref.pool[[3, 7]], tol_states, "states")


def test_kernel_runs_on_its_tensors_device_while_the_other_is_current():
    with torch.cuda.device(0):
        out, pool, ref = _verify_on("cuda:1", seed=1)
        assert out.device.index == 1
    _check(out, pool, ref)


def test_two_devices_from_two_threads_at_once():
    results, errors = {}, []

    def work(device_index):
        try:
            for seed in range(4):
                results[device_index, seed] = _verify_on(f"cuda:{device_index}", seed=10 * device_index + seed)
        except Exception as exc:  # reported below: an exception in a thread would otherwise be lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (device_index, _seed), (out, pool, ref) in results.items():
        assert out.device.index == device_index
        _check(out, pool, ref)


def test_each_variant_is_loaded_once_per_device(monkeypatch):
    loads = []
    original = dispatch._load_variant
    monkeypatch.setattr(dispatch, "_kernels", {})
    monkeypatch.setattr(dispatch, "_load_variant", lambda *a, **k: loads.append(a[3]) or original(*a, **k))
    for _ in range(3):
        for d in (0, 1):
            _check(*_verify_on(f"cuda:{d}", seed=d))
    assert sorted(loads) == [0, 1]


def test_stream_of_the_other_device_is_refused():
    case = Case(batch=2, T=1, H=8, G=2)
    case.kwargs = {k: v.to("cuda:1") if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    pool, out = case.pool.to("cuda:1"), case.out().to("cuda:1")
    before = pool.clone()
    stream0 = torch.cuda.Stream(device=0)
    with pytest.raises(DeviceError, match="does not belong to cuda:1"):
        runtime.launch("verify", mode="update", state=pool, out=out, stream=stream0,
                       state_indices=torch.tensor([0, 1], dtype=torch.int32, device="cuda:1"), **case.kwargs)
    torch.cuda.synchronize(1)
    assert torch.equal(pool, before) and torch.isnan(out).all(), "a refused call writes nothing"


def test_preload_prepares_every_device():
    loaded = runtime.preload(["verify"])
    assert {device for _key, device in loaded} == {0, 1}


def test_ssd_fwd_on_the_second_device_while_the_first_is_current():
    from reference import generators
    inputs = generators.standard_inputs(2, 200, 8, 64, 128, 2, torch.bfloat16, seed=4, z=True, initial_states=True)
    on1 = {k: v.to("cuda:1") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = torch.empty_like(on1["x"])
    final = torch.empty(2, 8, 64, 128, device="cuda:1")
    with torch.cuda.device(0):
        runtime.launch("ssd_fwd", **on1, out=out, final_states=final, chunk_size=64)
    torch.cuda.synchronize(1)
    ref = reference.ssd_reference(**inputs, chunk_size=64, return_final_states=True)
    tol = reference.TOLERANCES["bf16"]
    reference.assert_close_scaled(out.cpu(), ref["out"], tol["out"], "out")
    reference.assert_close_scaled(final.cpu(), ref["final_states"], tol["states"], "final_states")
