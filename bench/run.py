"""Every kernel family at its reference shapes, side by side with the Triton baseline in one process, plus the
scaling sweeps and cold start: the performance report's one command (on a machine with a GPU).

    PYTHONPATH=runtime:third_party_baseline python bench/run.py --json bench/results/h200.json
    python bench/report.py        # bench/README.md and bench/speedup.png from bench/results/*.json

The baseline is state-spaces/mamba's Triton kernels, imported from ``third_party_baseline/`` when present (its
source is never committed; README "Developer notes" says how to fetch it); without it, only our numbers are
recorded. Per row: CUDA-graph device time (median of 20 replays), eager wall time per call, the ratio to the
baseline, the bytes moved against the copy bandwidth measured in the same run (% of roofline), workspace
bytes. Cold start: a fresh process, from its start to the first completed kernel (Triton with an empty
compile cache). Results carry provenance (GPU, driver, CUDA, versions, git revision, command; no local path).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_chunk_cumsum
import bench_conv
import bench_ssd_bwd
import bench_ssd_fwd
import bench_verify
from common import copy_bandwidth, provenance

HERE = Path(__file__).resolve().parent
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

# What a cold process runs: imports, inputs, one call, a synchronize. Printed: the wall clock when done.
COLD_OURS = """
import torch
from mamba2_aot import runtime
import bench_ssd_fwd as b
s = b.REFERENCE_SHAPES[0]
kw = b.make_inputs(s)
runtime.launch("ssd_fwd", **kw, out=torch.empty_like(kw["x"]), chunk_size=s.Q, dt_softplus=True)
torch.cuda.synchronize()
print(__import__("time").time())
"""
COLD_TRITON = """
import torch
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
import bench_ssd_fwd as b
s = b.REFERENCE_SHAPES[0]
mamba_chunk_scan_combined(**b.make_inputs(s), chunk_size=s.Q, dt_softplus=True)
torch.cuda.synchronize()
print(__import__("time").time())
"""


def cold_start_s(code: str, env: dict) -> float | None:
    start = time.time()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  (cold start run failed: {done.stderr.strip().splitlines()[-1:]})", flush=True)
        return None
    return float(done.stdout.split()[-1]) - start


def cold_starts() -> dict:
    # the child runs where this process runs, so relative PYTHONPATH and MAMBA2_AOT_CUBIN_DIR mean the same
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = {"ours_s": cold_start_s(COLD_OURS, env)}
    with tempfile.TemporaryDirectory() as cache:
        result["triton_s"] = cold_start_s(COLD_TRITON, {**env, "TRITON_CACHE_DIR": cache})
    return result


def has_baseline() -> bool:
    try:
        return importlib.util.find_spec("mamba_ssm.ops.triton.ssd_combined") is not None
    except ImportError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--skip", nargs="*", default=[], choices=["ssd_fwd", "ssd_bwd", "ssd_chunk_cumsum", "verify",
                                                                    "conv", "scaling", "cold"])
    args = parser.parse_args()
    baseline = has_baseline()
    bw = copy_bandwidth()
    results = {"provenance": provenance(), "copy_bandwidth_GBps": bw / 1e9, "baseline": baseline}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; Triton baseline {'present' if baseline else 'absent'}", flush=True)

    reference_sections = (("ssd_fwd", "ssd_fwd", bench_ssd_fwd), ("ssd_bwd", "ssd_fwd + ssd_bwd", bench_ssd_bwd))
    for section, label, module in reference_sections:
        if section in args.skip:
            continue
        results[section] = []
        for s in bench_ssd_fwd.REFERENCE_SHAPES:
            row = module.measure(s, bw, baseline)
            results[section].append(row)
            print(f"{label} {s.name:<52} ours {row['ours']['us']:8.1f} us  triton "
                  f"{(row.get('triton') or {}).get('us', float('nan')):8.1f} us", flush=True)

    if "ssd_chunk_cumsum" not in args.skip:
        results["ssd_chunk_cumsum"] = bench_chunk_cumsum.measure(bw, baseline)
        print("ssd_chunk_cumsum done", flush=True)

    if "verify" not in args.skip:
        results["verify"] = {"shape": dict(H=bench_verify.H, P=bench_verify.P, N=bench_verify.N, G=bench_verify.G),
                             "rows": []}
        for batch in bench_verify.BATCHES:
            for T in bench_verify.TS:
                row = {"batch": batch, "T": T, **bench_verify.measure(batch, T, bw, baseline)}
                results["verify"]["rows"].append(row)
                print(f"verify batch {batch:>3} T {T}: update {row['update']['us']:8.1f} us  triton "
                      f"{(row.get('triton') or {}).get('us', float('nan')):8.1f} us", flush=True)

    if "conv" not in args.skip:
        results["conv"] = {"shape": dict(H=bench_conv.H, P=bench_conv.P, N=bench_conv.N, G=bench_conv.G,
                                         K=bench_conv.K), "rows": []}
        for batch in bench_conv.BATCHES:
            for mode, T in bench_conv.CASES:
                row = {"batch": batch, "mode": mode, "T": T, **bench_conv.measure(batch, mode, T, bw)}
                results["conv"]["rows"].append(row)
                print(f"fused verify batch {batch:>3} {mode} T {T}: fused {row['fused_us']:8.1f} us  pair "
                      f"{row['pair_us']:8.1f} us", flush=True)

    if "scaling" not in args.skip:
        by_L, by_batch = bench_ssd_fwd.scaling_shapes()
        results["scaling"] = {
            "ssd_fwd_by_L": [bench_ssd_fwd.measure(s, bw, baseline=False) for s in by_L],
            "ssd_fwd_by_batch": [bench_ssd_fwd.measure(s, bw, baseline=False) for s in by_batch],
            "decode_by_batch": [],
        }
        for batch in DECODE_BATCHES:
            row = {"batch": batch, **bench_verify.measure(batch, 1, bw, baseline, modes=("update",))}
            results["scaling"]["decode_by_batch"].append(row)
        print("scaling sweeps done", flush=True)

    if "cold" not in args.skip:
        results["cold_start"] = cold_starts()
        print(f"cold start: {results['cold_start']}", flush=True)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
