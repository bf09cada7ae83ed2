"""Builds of our own cubins, A (the baseline) and B, C, ..., measured in turn at the reference shapes: a kernel
change's A/B, or several experiments' against one baseline in one run.

    PYTHONPATH=runtime python bench/ab.py ssd_bwd A_DIR B_DIR [C_DIR ...] [--rounds 3] [SHAPE_POSITION ...]

The directories are cubin directories as ``MAMBA2_AOT_CUBIN_DIR`` takes them (a build's ``build/stage``); the
arguments that are whole numbers are shape positions. Each round runs every build, each in a fresh process with that
directory only, unvalidated variants allowed (an ``experiment=`` build's), in an order that rotates by one build per
round (two builds: AB, BA, AB, ...), so that no build always runs first. Per shape and build, with the benchmarks' own calls and input sets
(``bench_ssd_fwd.our_forward``, ``bench_ssd_bwd.our_training_step``): the CUDA-graph time of the call (ssd_fwd: the
forward; ssd_bwd: the backward alone, after one forward per input set), each kernel's device time per call (torch.profiler,
by family), and a sha256 of every output of one fixed call: a build's outputs are bitwise A's, or its change
altered the arithmetic; a build's outputs that differ between its rounds are not deterministic. Shapes: positions
in ``bench_ssd_fwd.REFERENCE_SHAPES`` (all four by default). Each build is reported against A.
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


def builds_and_positions(items: list[str]) -> tuple[dict[str, str], list[int]]:
    """The command line's directories, labelled A, B, C, ... in order, and its shape positions (the whole numbers;
    all of them when none is given). Raises ValueError for fewer than two directories, more than 26, or a position
    past the reference shapes."""
    dirs = [item for item in items if not item.isdigit()]
    positions = [int(item) for item in items if item.isdigit()]
    if not 2 <= len(dirs) <= 26:
        raise ValueError(f"expected 2 to 26 cubin directories (the first is the baseline), got {len(dirs)}: {dirs}")
    bad = [p for p in positions if p >= len(REFERENCE_SHAPES)]
    if bad:
        raise ValueError(f"shape positions {bad}: there are {len(REFERENCE_SHAPES)} reference shapes")
    return {chr(ord("A") + i): d for i, d in enumerate(dirs)}, positions or list(range(len(REFERENCE_SHAPES)))


def round_order(labels: list[str], r: int) -> list[str]:
    """Round r's order of the builds: rotated by r (two builds: AB, BA, AB, ...; three: ABC, BCA, CAB, ...)."""
    return labels[r % len(labels):] + labels[:r % len(labels)]


def report(family: str, positions: list[int], runs: dict[str, list[list[dict]]]) -> str:
    """Per shape, each build's medians against A's (the call, with each round's time, and each kernel), and whether its
    outputs are A's."""
    lines = []
    base = "A"
    for k, position in enumerate(positions):
        lines.append(REFERENCE_SHAPES[position].name)

        def median(label, value):
            return statistics.median(value(run[k]) for run in runs[label])

        a_us = median(base, lambda result: result["us"])
        for label in runs:
            us = median(label, lambda result: result["us"])
            versus = "" if label == base else f"  ({100 * (us / a_us - 1):+.1f} % against A)"
            rounds = " / ".join(f"{run[k]['us']:.1f}" for run in runs[label])  # (the spread: is a difference noise?)
            lines.append(f"  {family} {label}: {us:8.1f} us{versus}  rounds {rounds}")
        for kernel in sorted({name for label in runs for run in runs[label] for name in run[k]["kernels"]}):
            times = {label: median(label, lambda result: result["kernels"].get(kernel, float("nan"))) for label in runs}
            lines.append(f"    {kernel:<40} " + "  ".join(
                f"{label} {us:8.1f}" + ("" if label == base else f" ({100 * (us / times[base] - 1):+.1f} %)")
                for label, us in times.items()))
        digests = {label: {str(run[k]["digests"]) for run in runs[label]} for label in runs}
        for label in runs:
            if len(digests[label]) > 1:
                lines.append(f"  NOT DETERMINISTIC: build {label}'s outputs differ between rounds")
        for label in runs:
            if label == base:
                continue
            same = digests[label] == digests[base] and len(digests[base]) == 1
            lines.append(f"  outputs A vs {label}: " + ("bitwise equal" if same else
                         f"DIFFER  A {runs[base][0][k]['digests']}\n  {label} {runs[label][0][k]['digests']}"))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=("ssd_fwd", "ssd_bwd"))
    parser.add_argument("items", nargs="+", metavar="DIR_OR_POSITION",
                        help="cubin directories (the first is the baseline, A), then shape positions")
    parser.add_argument("--rounds", type=_at_least_one, default=3)
    args = parser.parse_intermixed_args(argv)
    try:
        builds, positions = builds_and_positions(args.items)
    except ValueError as error:
        parser.error(str(error))
    runs = {label: [] for label in builds}
    for r in range(args.rounds):
        for label in round_order(list(builds), r):
            runs[label].append(_run(args.family, builds[label], positions))
    print(report(args.family, positions, runs), flush=True)


if __name__ == "__main__":
    main()
