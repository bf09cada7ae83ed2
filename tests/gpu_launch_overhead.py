"""Measure the runtime's host overhead per launch and its cold start (prints numbers; asserts nothing).

    PYTHONPATH=runtime python tests/gpu_launch_overhead.py [--launches 20000]

* steady state: wall time per ``runtime.launch("ssd_chunk_cumsum", ...)`` from torch tensors on a tiny
  problem (GPU time per kernel is below the host time, so the host is what is measured), with
  ``stream=None`` (torch's current stream looked up per call) and with an explicit int handle, plus
  the split: adapting + validating a call whose result is not memoised (new buffers every call) and
  the bare ``cuLaunchKernelEx`` with prepacked parameters.
  Target: < 20 µs per launch.
* cold start: in a fresh process where torch already holds a CUDA context (excluded), the time from
  ``import mamba2_aot`` to the first kernel completed. Target: < 150 ms.

Cubins: an installed wheel, ``MAMBA2_AOT_CUBIN_DIR``, or else the repository's ``build/stage``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Builds a tiny ssd_chunk_cumsum problem as `args` (torch, CUDA) without importing mamba2_aot.
SETUP = """
import math, torch
Q = {chunk_size}
args = dict(dt=torch.randn(1, Q, 8, device="cuda").to(torch.{dtype}), A=-torch.rand(8, device="cuda"),
            dt_out=torch.empty(1, 8, 1, Q, device="cuda"), dA_cumsum=torch.empty(1, 8, 1, Q, device="cuda"),
            chunk_size=Q)
torch.cuda.synchronize()
"""

COLD = """
import time
t0 = time.perf_counter()
import mamba2_aot
from mamba2_aot import runtime
t1 = time.perf_counter()
runtime.launch("ssd_chunk_cumsum", **args)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({{"import_ms": (t1 - t0) * 1e3, "first_launch_ms": (t2 - t1) * 1e3, "total_ms": (t2 - t0) * 1e3}}))
"""


def _environment() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO / "runtime"))
    if "MAMBA2_AOT_CUBIN_DIR" not in env and (REPO / "build" / "stage").is_dir():
        sys.path.insert(0, str(REPO / "runtime"))
        from mamba2_aot import manifest

        if not manifest.discover({}).manifests:
            env["MAMBA2_AOT_CUBIN_DIR"] = str(REPO / "build" / "stage")
    return env


def _timed(fn, n: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean µs per call of ``fn`` over ``n`` calls."""
    import torch

    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter_ns() - start) / n / 1e3)
        torch.cuda.synchronize()
    return statistics.median(samples)


def steady_state(n: int, chunk_size: int, dtype: str) -> dict:
    import torch  # noqa: F401 - the SETUP code uses it

    scope: dict = {}
    exec(SETUP.format(chunk_size=chunk_size, dtype=dtype), scope)
    args = scope["args"]
    from mamba2_aot import driver, dispatch, manifest, runtime
    from mamba2_aot.plans import PLANS
    from mamba2_aot.tensors import as_device_array
    from mamba2_aot.validation import check_call

    runtime.preload(["ssd_chunk_cumsum"])
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(200):
        runtime.launch("ssd_chunk_cumsum", **args)
    plan = PLANS["ssd_chunk_cumsum"]
    arrays = {k: as_device_array(v, k) if k in plan.arrays else v for k, v in args.items()}
    call = plan.bind(**arrays)
    kernel = dispatch._kernels[("ssd_chunk_cumsum", manifest.constants_key(call.constants), 0)]
    drv = driver.get()
    packed = kernel.packer.load(kernel.packer.pack(call.params))

    def adapt_and_validate():  # what a launch with new pointers costs before the driver (no memo)
        check_call(plan.bind(**{k: as_device_array(v, k) if k in plan.arrays else v for k, v in args.items()}))

    def bare_launch():
        drv.launch(kernel.function, call.grid, kernel.block, kernel.smem, stream, kernel.attrs, kernel.num_attrs,
                   packed)

    return {
        "launch(stream=None) us": _timed(lambda: runtime.launch("ssd_chunk_cumsum", **args), n),
        "launch(stream=int) us": _timed(lambda: runtime.launch("ssd_chunk_cumsum", stream=stream, **args), n),
        "adapt+validate (no memo) us": _timed(adapt_and_validate, n),
        "bare cuLaunchKernelEx us": _timed(bare_launch, n),
    }


def cold_start(env: dict, chunk_size: int, dtype: str, runs: int = 3) -> list[dict]:
    code = "import json\n" + SETUP.format(chunk_size=chunk_size, dtype=dtype) + COLD.format()
    results = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                             timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"cold-start run failed:\n{out.stderr}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20000)
    args = parser.parse_args()
    env = _environment()
    os.environ.update(env)
    sys.path.insert(0, str(REPO / "runtime"))
    import torch

    from mamba2_aot import manifest

    cc = torch.cuda.get_device_capability(0)
    variant = sorted(manifest.catalog().index(cc).values(), key=lambda v: v.key)[0]
    chunk_size = variant.constants["chunk_size"]
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[variant.constants["dt_dtype"]]
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; variant {variant.key}")
    for name, value in steady_state(args.launches, chunk_size, dtype).items():
        print(f"steady state  {name:28s} {value:8.2f}")
    for run in cold_start(env, chunk_size, dtype):
        print("cold start    " + "  ".join(f"{k} {v:7.1f}" for k, v in run.items()))


if __name__ == "__main__":
    main()
