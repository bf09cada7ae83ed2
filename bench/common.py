"""What every benchmark here shares: CUDA-graph timing, the copy-bandwidth roofline, ours and the baseline run
side by side in one fresh process, and the provenance recorded with results (no local paths)."""
from __future__ import annotations

import math
import multiprocessing
import os
import platform
import subprocess
import sys
import time

import torch

REPLAYS = 20
L2_FLUSH_BYTES = 240e6  # what one graph replay touches: 4x the H200's 60 MB L2, so no launch finds its inputs there


def graph_time_us(fn, launches_per_graph: int) -> float:
    """Median device time of one ``fn`` call, from replays of a CUDA graph of ``launches_per_graph`` calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(launches_per_graph):
            fn(i)
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches_per_graph)
    times.sort()
    return times[len(times) // 2]


def graph_time_after_gemm_us(fn, launches_per_graph: int) -> float:
    """:func:`graph_time_us` of ``fn`` when each call follows a 2048³ bf16 cuBLAS GEMM, the GEMM's own time
    subtracted: as in a model, where a kernel follows others (after a GEMM, an ssd_fwd call at B2 N128 +z took 11 µs
    more than back to back, Triton's 0.3–0.6: docs/PERF_NOTES.md, twenty-second session). An upper bound by a little:
    the GEMM timed alone finds its inputs in L2, after ``fn`` it may not."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)

    def gemm(i):
        return torch.mm(a, b)
    return graph_time_us(lambda i: (gemm(i), fn(i)), launches_per_graph) - graph_time_us(gemm, launches_per_graph)


def eager_time_us(fn, variants: int, calls: int = 50) -> float:
    """Wall time per ``fn(i)`` call issued back to back from Python (``i`` cycling over ``variants``) until the
    device is done: what a framework's eager mode sees, launch overhead included."""
    fn(0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i % variants)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def rotation(bytes_per_call: float, most: int = 64) -> int:
    """How many distinct input sets a graph cycles through so that no launch finds its data in L2."""
    return min(most, max(2, math.ceil(L2_FLUSH_BYTES / bytes_per_call)))


def copy_bandwidth() -> float:
    """Bytes/s of a large copy done by SM threads (read + write counted): the roofline's bandwidth.

    (An elementwise kernel, not copy_: a same-dtype device-to-device copy_ may go to the copy engines,
    which measured 2.8 TB/s on the H200, below what SM kernels reach.)"""
    a = torch.empty(512 * 1024**2, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    t = graph_time_us(lambda i: torch.mul(a, 1.0, out=b), 4)
    return 2 * a.numel() * a.element_size() / (t * 1e-6)


def _side_by_side_worker(ours, baseline, args, queue):
    queue.put(ours(*args))
    if baseline is not None:
        try:
            queue.put(baseline(*args))
        except ImportError:
            queue.put(float("nan"))


def side_by_side(ours, baseline, *args) -> tuple:
    """``(ours(*args), baseline(*args))`` measured one after the other in one fresh process, so that both see the
    same process and device state (at a 5 µs decode, Triton measured in a child while ours ran in the parent read
    up to 8 % faster than side by side); ours alone in a fresh process when ``baseline`` is None, so that figures
    with and without the baseline compare. The baseline's result is None when it is not given, when it fails
    there (Triton's selective_state_update raised cudaErrorInvalidAddressSpace at batch 256, T >= 4 under graph
    capture on the H200: a fresh process keeps that from poisoning the next measurement) or is not importable;
    ours was measured before it ran."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()   # (a put is written at once: ours survives a baseline that kills the process)
    child = ctx.Process(target=_side_by_side_worker, args=(ours, baseline, args, queue))
    child.start()
    results = []
    while child.is_alive() or not queue.empty():   # read as results come: a put waits while the pipe is full
        if queue.empty():
            child.join(0.1)
        else:
            results.append(queue.get())
    if not results:
        raise RuntimeError(f"{getattr(ours, '__name__', ours)}{args} failed in its child process (exit code "
                           f"{child.exitcode})")
    if baseline is None:
        return results[0], None
    if len(results) < 2:
        print(f"  (baseline {baseline.__name__}{args} failed: exit code {child.exitcode})", flush=True)
        return results[0], None
    return results[0], None if results[1] != results[1] else results[1]


def with_baseline(row: dict, triton) -> dict:
    """``row`` (ours in ``row["ours"]["us"]``) with the baseline's measurement as ``row["triton"]`` and, when it
    ran, ``row["speedup"]`` (Triton's time over ours)."""
    row["triton"] = triton
    if triton is not None:
        row["speedup"] = triton["us"] / row["ours"]["us"]
    return row


def provenance():
    """GPU, driver and package versions, the git revision, and the command (file names only, no local paths).

    Where the tree was copied without its .git (a lent GPU machine), the revision comes from the
    MAMBA2_AOT_GIT_REVISION / MAMBA2_AOT_GIT_DIRTY variables the caller sets."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    revision = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain")) if revision else os.environ.get("MAMBA2_AOT_GIT_DIRTY") == "1"
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "git_revision": revision or os.environ.get("MAMBA2_AOT_GIT_REVISION"), "git_dirty": dirty,
            "command": " ".join(os.path.basename(a) if os.path.isabs(a) else a for a in sys.argv)}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.split()[0]  # one line per GPU
    except OSError:
        pass
    import mamba2_aot
    from mamba2_aot import manifest
    info["mamba2_aot"] = mamba2_aot.__version__
    # how the cubins were built (the DSL is not needed, or present, where they run)
    info["cubins"] = {m.arch: dict(m.toolchain) for m in manifest.catalog().manifests}
    return info
