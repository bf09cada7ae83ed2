"""Two builds of our own cubins, A and B, measured alternately at the reference shapes: a kernel change's A/B.

    PYTHONPATH=runtime python bench/ab.py ssd_bwd A_DIR B_DIR [--rounds 3] [SHAPE_POSITION ...]

``A_DIR`` / ``B_DIR`` are cubin directories as ``MAMBA2_AOT_CUBIN_DIR`` takes them (a build's ``build/stage``). Each
round runs A, then B (B first in odd rounds), each in a fresh process with that directory only, unvalidated variants
allowed (an ``experiment=`` build's). Per shape and build, with the benchmarks' own calls and input sets
(``bench_ssd_fwd.our_forward``, ``bench_ssd_bwd.our_training_step``): the CUDA-graph time of the call (ssd_fwd: the
forward; ssd_bwd: the backward alone, after one forward per input set), each kernel's device time per call (torch.profiler,
by family), and a sha256 of every output of one fixed call: the builds' outputs are bitwise equal, or the change
altered the arithmetic; a build's outputs that differ between its rounds are not deterministic. Shapes: positions
in ``bench_ssd_fwd.REFERENCE_SHAPES`` (all four by default).
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics

import torch

from pathlib import Path

from bench_ssd_bwd import our_training_step
from bench_ssd_fwd import REFERENCE_SHAPES, our_forward
from common import graph_time_us

PROFILED_CALLS = 5


def _family_of(symbols: dict, name: str) -> str:
    for symbol, family in symbols.items():
        if symbol in name or name in symbol:
            return family
    return name[:40]


def _measure(family: str, cubin_dir: str, positions: list[int], queue) -> None:
    """In a fresh process: every picked shape with the cubins of ``cubin_dir`` only (see the module docstring)."""
    os.environ["MAMBA2_AOT_CUBIN_DIR"] = cubin_dir
    os.environ["MAMBA2_AOT_ALLOW_UNVALIDATED"] = "1"
    from mamba2_aot import manifest
    catalog = manifest.catalog()
    foreign = [str(m.path) for m in catalog.manifests if not m.path.resolve().is_relative_to(Path(cubin_dir).resolve())]
    if catalog.problems or foreign or not catalog.manifests:  # (else installed wheels would stand in, unnoticed)
        raise SystemExit(f"{cubin_dir}: problems {[str(p.error) for p in catalog.problems]}, manifests from elsewhere "
                         f"{foreign}, {len(catalog.manifests)} manifests")
    symbols = {v.kernel: v.family for m in catalog.manifests for v in m.variants}
    results = []
    for s in (REFERENCE_SHAPES[p] for p in positions):
        torch.manual_seed(0)  # (the benchmarks' douts come from torch's global generator: the same in every process)
        if family == "ssd_fwd":
            timed, n, outputs, _ = our_forward(s)
        else:
            forward, timed, n, outputs, _ = our_training_step(s)
            for i in range(n):
                forward(i)
        timed(0)
        torch.cuda.synchronize()
        digests = {name: hashlib.sha256(t.cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
                   for name, t in outputs(0).items()}
        us = graph_time_us(timed, n)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(PROFILED_CALLS):
                timed(i % n)
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for event in prof.key_averages():
            total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
            if total > 0:
                key = _family_of(symbols, event.key)
                kernels[key] = kernels.get(key, 0.0) + total / PROFILED_CALLS
        results.append({"shape": s.name, "us": us, "kernels": kernels, "digests": digests})
    queue.put(results)


def _run(family: str, cubin_dir: str, positions: list[int]) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=_measure, args=(family, cubin_dir, positions, queue))
    child.start()
    while child.is_alive() and queue.empty():
        child.join(0.1)
    results = None if queue.empty() else queue.get()   # (read before the join: a put waits while the pipe is full)
    child.join()
    if results is None:
        raise RuntimeError(f"measuring {cubin_dir} failed (exit code {child.exitcode})")
    return results


def _at_least_one(value: str) -> int:
    if int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return int(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=("ssd_fwd", "ssd_bwd"))
    parser.add_argument("a_dir")
    parser.add_argument("b_dir")
    parser.add_argument("--rounds", type=_at_least_one, default=3)
    parser.add_argument("positions", type=int, nargs="*", choices=range(len(REFERENCE_SHAPES)), metavar="POSITION")
    args = parser.parse_intermixed_args(argv)
    positions = args.positions or list(range(len(REFERENCE_SHAPES)))
    runs = {"A": [], "B": []}
    for r in range(args.rounds):
        for label in ("AB" if r % 2 == 0 else "BA"):
            runs[label].append(_run(args.family, args.a_dir if label == "A" else args.b_dir, positions))
    for k, position in enumerate(positions):
        name = REFERENCE_SHAPES[position].name
        a_us = statistics.median(run[k]["us"] for run in runs["A"])
        b_us = statistics.median(run[k]["us"] for run in runs["B"])
        print(f"{name}\n  {args.family}: A {a_us:8.1f}  B {b_us:8.1f} us  ({100 * (b_us / a_us - 1):+.1f} %)")
        for kernel in sorted({name for run in runs["A"] + runs["B"] for name in run[k]["kernels"]}):
            a_k = statistics.median(run[k]["kernels"].get(kernel, float("nan")) for run in runs["A"])
            b_k = statistics.median(run[k]["kernels"].get(kernel, float("nan")) for run in runs["B"])
            print(f"    {kernel:<40} A {a_k:8.1f}  B {b_k:8.1f} us  ({100 * (b_k / a_k - 1):+.1f} %)")
        digests = {label: {str(run[k]["digests"]) for run in runs[label]} for label in runs}
        for label in runs:
            if len(digests[label]) > 1:
                print(f"  NOT DETERMINISTIC: build {label}'s outputs differ between rounds")
        same = digests["A"] == digests["B"] and len(digests["A"]) == 1
        print(f"  outputs A vs B: {'bitwise equal' if same else 'DIFFER'}"
              + ("" if same else f"  A {runs['A'][0][k]['digests']}\n  B {runs['B'][0][k]['digests']}"), flush=True)


if __name__ == "__main__":
    main()
